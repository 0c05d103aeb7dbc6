package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/pgfence/pgfence/fencing"
)

// Info describes a grant of a lease as stored in PostgreSQL. Times are the
// database server's clock.
type Info struct {
	Name       string
	Owner      string // owner prefix + "-" + per-grant random suffix
	Fence      int64  // strictly increasing across grants of all leases
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
	// Data is the JSON value the grant published (WithData, SetData),
	// compact as PostgreSQL's jsonb prints it; nil for none.
	Data json.RawMessage
}

// Lease is one grant of a named lease to this client. It stays held while
// the client's keepalive renews it; its Context is cancelled the moment it
// is no longer safely held. A Lease's methods are safe for concurrent use.
type Lease struct {
	c      *Client
	name   string
	owner  string
	fence  int64
	since  time.Time // local clock when the grant was received: hold duration
	ctx    context.Context
	cancel context.CancelCauseFunc
	sem    string // the semaphore whose slot this grant is; "" for a lease
	slot   int    // the slot's number, from 1; 0 for a lease

	// releaseTurn, buffered 1, serialises Release calls: a second call
	// waits for the first's statement and then sees its outcome, rather
	// than racing it to the server, where the loser would find the grant
	// already ended and report it lost. Made by the first Release (turn),
	// so that a held lease does not carry it; guarded by c.mu.
	releaseTurn chan struct{}

	// renewMu serialises the statements that renew this grant (Renew,
	// Extend, the keepalive's batch), so that the local deadline always
	// follows the request PostgreSQL applied last. The keepalive only
	// tries it and retries shortly if it is taken. Taken before c.mu.
	renewMu sync.Mutex

	// Guarded by c.mu.
	ttl        time.Duration // changed by Extend
	data       json.RawMessage
	handover   bool  // an operator asked this grant to step down
	ended      error // after handover: why the hold ended since (Err reports it)
	state      leaseState
	acquiredAt time.Time     // server clock
	expiresAt  time.Time     // server clock, as of the last grant/renew
	deadline   time.Time     // local, monotonic: last request start + ttl - margin
	nextRenew  time.Time     // local, monotonic: last request start + ttl/3
	dlPos      int           // 1 + index in the client's deadline heap; 0: not in it
	minHold    time.Duration // HoldAtLeast: Release keeps the grant until acquiredAt + minHold
	rechecking bool          // a recheck is queued and has not begun its renewal
}

type leaseState uint8

const (
	stateHeld leaseState = iota
	stateLost
	stateReleasing // Release called: locally released, grant not yet ended
	stateReleased  // grant ended (or found gone)
)

// nilLease is the Context of a nil *Lease: ended, with an invalid input
// error as its cause, as a nil pglock.Lock's is.
var nilLease = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(invalid("leases: lease is nil"))
	return ctx
}()

// Name returns the lease's name ("" for a nil Lease; its other accessors
// return zero values too, and its Context has ended with ErrInvalid).
func (l *Lease) Name() string {
	if l == nil {
		return ""
	}
	return l.name
}

// Owner returns the owner stored with this grant: the client's owner
// prefix, "-", and a random suffix unique to this grant.
func (l *Lease) Owner() string {
	if l == nil {
		return ""
	}
	return l.owner
}

// Fence returns this grant's fence. Every grant of any lease takes a higher
// fence than all earlier grants. Pass it (see Token) with every write to a
// protected resource, so that a stale holder's writes are rejected.
func (l *Lease) Fence() int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

// Token returns the fencing token of this grant, for fencing.Begin/InTx.
func (l *Lease) Token() fencing.Token {
	if l == nil {
		return fencing.Token{} // invalid: Begin and InTx refuse it
	}
	return fencing.Token{Lease: l.name, Fence: l.fence}
}

// TTL returns the lease's time to live.
func (l *Lease) TTL() time.Duration {
	if l == nil {
		return 0
	}
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.ttl
}

// ExpiresAt returns the server's expires_at as of the last successful grant
// or renewal (database clock; do not compare it with the local clock).
func (l *Lease) ExpiresAt() time.Time {
	if l == nil {
		return time.Time{}
	}
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.expiresAt
}

// Context returns a context that is cancelled, with a cause, as soon as the
// lease is not safely held: at the local deadline (start of the last
// successful grant/renewal request + TTL − TTL/10, on the monotonic clock)
// if no renewal succeeded by then, at once when a renewal finds the grant
// gone, and on Release or Close. The cause (context.Cause) wraps ErrLost or
// ErrReleased — or ErrHandover when an operator asked for a hand-over: then
// the lease is still held and renewed until Release, so stop the work and
// release it (the cause stays ErrHandover; Err says how the hold ended).
// Do the lease's work under this context and check it before every
// externally visible effect; it is not derived from the context passed to
// Acquire.
func (l *Lease) Context() context.Context {
	if l == nil {
		return nilLease
	}
	return l.ctx
}

// Done is closed when the lease is no longer safely held
// (Context().Done()).
func (l *Lease) Done() <-chan struct{} { return l.Context().Done() }

// Err returns nil while the lease is held and no hand-over was requested,
// then an error wrapping ErrLost, ErrReleased or ErrHandover (the cause of
// Context). After a hand-over request the lease is still held, and Err
// says ErrHandover until the hold ends: then it says how (ErrReleased,
// ErrLost), while Context's cause, set once, stays ErrHandover.
func (l *Lease) Err() error {
	if l == nil {
		return context.Cause(nilLease)
	}
	if l.ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(l.ctx); !errors.Is(cause, ErrHandover) {
		return cause
	}
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.errLocked()
}

// heldErr is nil while l is held, a hand-over requested or not, and Err
// once it is not.
func (l *Lease) heldErr() error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if l.state == stateHeld {
		return nil
	}
	return l.errLocked()
}

// errLocked is Err with c.mu held.
func (l *Lease) errLocked() error {
	if l.ended != nil {
		return l.ended
	}
	return context.Cause(l.ctx)
}

// endLocked ends l's hold with cause: cancels its Context, or, when a
// hand-over request has ended that already, keeps cause for Err. c.mu held.
func (l *Lease) endLocked(cause error) {
	if l.handover && l.ended == nil {
		l.ended = cause
	}
	l.cancel(cause)
}

// Renew renews the lease now, in addition to the automatic keepalive,
// waiting for row locks as long as ctx allows. It returns nil on success,
// an error wrapping ErrLost (and the lease is lost) if the grant is gone,
// Err() if the lease is no longer held, and another error (the lease stays
// held until its local deadline) if PostgreSQL could not be reached. Safe
// to call concurrently with the keepalive and to repeat.
func (l *Lease) Renew(ctx context.Context) error {
	if l == nil || ctx == nil {
		return invalid("leases: renew: lease and context must not be nil")
	}
	if err := l.heldErr(); err != nil {
		return err
	}
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	start := time.Now()
	var expiresAt *time.Time
	ctx, span := l.c.tr.Start(ctx, spanRenew, l.name, l.fence)
	err := l.c.q.QueryRow(ctx, sqlRenew, l.name, l.owner, l.fence, l.TTL().Microseconds()).Scan(&expiresAt)
	span.End(0, err)
	if err == nil && expiresAt == nil {
		l.c.m.recordRenewal(l.name, renewLost)
		lost := l.goneErr("renew")
		l.c.lose(l, lostRenewRejected, lost, false)
		return l.Err() // lost, or released meanwhile
	}
	if err != nil {
		l.c.m.recordRenewal(l.name, renewError)
		return dbError(fmt.Sprintf("renew %q", l.name), err)
	}
	l.c.m.recordRenewal(l.name, renewRenewed)
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if l.state != stateHeld {
		return l.errLocked()
	}
	l.c.renewedLocked(l, start, *expiresAt)
	return nil
}

// goneErr is the loss of l found by op (renew, extend, set data of): the
// server matched no live grant of (name, owner, fence).
func (l *Lease) goneErr(op string) error {
	return fmt.Errorf("leases: %s %q: grant (fence %d) expired, force-released or taken over: %w", op, l.name, l.fence, ErrLost)
}

// turn returns l's release turn (releaseTurn), made at the first call.
func (l *Lease) turn() chan struct{} {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	if l.releaseTurn == nil {
		l.releaseTurn = make(chan struct{}, 1)
	}
	return l.releaseTurn
}

// Release gives the lease up: it cancels Context with cause ErrReleased
// first, then expires the grant and notifies waiters in one statement.
// It returns nil when the grant was ended while live, or when an earlier
// Release already did; an error wrapping ErrLost when the lease had been
// lost (its work may not have been exclusive); another error when
// PostgreSQL could not be reached — the lease is released locally anyway,
// and the Client ends the grant in the background (Close does, if it
// comes first; once Close has begun, Release tries once more before it
// returns, bounded by WithReleaseTimeout) or else it expires after the
// TTL; calling Release again retries. ctx bounds the statement.
// Concurrent calls take turns: a call made while another runs waits for it
// (as long as ctx allows) and then returns nil if that one ended the grant.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil || ctx == nil {
		return invalid("leases: release: lease and context must not be nil")
	}
	c := l.c
	// Another Release of l in flight ends the hold first (its Context is
	// cancelled already); this one waits for its outcome.
	// A ctx already ended still releases locally: the turn is tried
	// first, not raced against ctx.
	turn := l.turn()
	select {
	case turn <- struct{}{}:
	default:
		select {
		case turn <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("leases: release %q: %w", l.name, context.Cause(ctx))
		}
	}
	defer func() { <-turn }()
	c.mu.Lock()
	wasHeld := l.state == stateHeld
	switch l.state {
	case stateReleased:
		c.mu.Unlock()
		return nil
	case stateLost:
		c.mu.Unlock()
		// End the grant anyway in case it is still ours (lost at the local
		// deadline before the server's expiry): hand-over sooner.
		_, _ = c.q.Exec(ctx, c.releaseSQL(), l.name, l.owner, l.fence)
		return l.Err()
	case stateHeld:
		l.state = stateReleasing
		c.dropLocked(l)
		l.endLocked(ErrReleased)
		// This client's own waiters attempt once the release has
		// committed: before, an attempt could only fail — a wasted
		// statement per hand-over.
		c.releasing[l.name]++
		defer func() {
			c.mu.Lock()
			if c.releasing[l.name]--; c.releasing[l.name] <= 0 {
				delete(c.releasing, l.name)
			}
			c.mu.Unlock()
			c.wakeQueue(l.queue())
		}()
	}
	minHold := l.minHold
	c.mu.Unlock()
	end := time.Now()
	if wasHeld && minHold > 0 {
		// A renewal of this grant already on its way would land after
		// the release and move expires_at to its own now + TTL, cutting
		// the minimum hold short (or stretching it): let it finish
		// first. No other begins: the lease is off the keepalive's list.
		// (A plain release needs no wait: it ends the grant, and a
		// renewal renews only a live one.)
		l.renewMu.Lock()
		defer l.renewMu.Unlock()
	}

	var live *bool
	var err error
	ctx, span := c.tr.Start(ctx, spanRelease, l.name, l.fence)
	if minHold > 0 {
		err = c.q.QueryRow(ctx, c.releaseAtLeastSQL(), l.name, l.owner, l.fence, minHold.Microseconds()).Scan(&live, new(string))
	} else {
		err = c.q.QueryRow(ctx, c.releaseSQL(), l.name, l.owner, l.fence).Scan(&live, new(string))
	}
	span.End(0, err)
	switch {
	case err == nil && !wasHeld:
		// An earlier Release or Close, whose statement failed, released
		// l while its grant was live (else l would be lost): whether that
		// statement, endLater or the TTL has ended the grant since,
		// nothing was lost.
		c.setState(l, stateReleased)
		return nil
	case err == nil && live == nil:
		c.setState(l, stateReleased)
		err = fmt.Errorf("leases: release %q: grant (fence %d) was already gone: %w", l.name, l.fence, ErrLost)
		c.releasedLost(l, end, err)
		return err
	case err != nil:
		if wasHeld {
			c.released(l, end) // locally
			if minHold == 0 {
				c.endLater(ctx, l)
			}
		}
		return dbError(fmt.Sprintf("release %q", l.name), err)
	}
	c.setState(l, stateReleased)
	if !*live {
		err = fmt.Errorf("leases: release %q: grant (fence %d) had expired by the database clock: %w", l.name, l.fence, ErrLost)
		c.releasedLost(l, end, err)
		return err
	}
	c.released(l, end)
	return nil
}

// releaseSQL is the release statement: committed asynchronously unless
// WithDurableRelease.
func (c *Client) releaseSQL() string {
	if c.cfg.durableRelease {
		return sqlReleaseDurable
	}
	return sqlRelease
}

// released records the end of l's hold by Release at end.
func (c *Client) released(l *Lease, end time.Time) {
	c.m.recordHold(l, false, end)
	if c.log.Enabled(context.Background(), slog.LevelDebug) {
		c.log.Debug("leases: released", "name", l.name, "owner", l.owner, "fence", l.fence, "held", end.Sub(l.since))
	}
}

// endLater hands the grant of l, released locally but not ended (its
// statement, under ctx, failed), to the keepalive to end, as it ends a
// lost lease's (orphanLocked). Once Close has begun, neither the
// keepalive nor Close (which ends what it holds, and l was no longer
// held) would: it ends the grant itself, bounded by the release timeout
// rather than by ctx, which may be what failed the statement.
func (c *Client) endLater(ctx context.Context, l *Lease) {
	c.mu.Lock()
	closed := c.isClosed()
	c.orphanLocked(l)
	c.mu.Unlock()
	if !closed || c.hooks.noKeepalive {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.releaseTimeout)
	defer cancel()
	if _, err := c.releaseBatch(rctx, "release after close", []*Lease{l}); err != nil {
		c.log.Warn("leases: release after close failed; the grant expires after its TTL", "name", l.name, "fence", l.fence, "err", err)
	}
}

// releasedLost records that Release found l's grant gone or expired: it
// had been lost unnoticed.
func (c *Client) releasedLost(l *Lease, end time.Time, err error) {
	c.m.recordHold(l, true, end)
	c.m.recordLost(l.name, lostReleaseRejected)
	c.log.Warn("leases: lease lost", "name", l.name, "owner", l.owner, "fence", l.fence,
		"cause", lostCauseNames[lostReleaseRejected], "held", end.Sub(l.since), "err", err)
}

// String describes the grant for logs.
func (l *Lease) String() string {
	if l == nil {
		return "lease <nil>"
	}
	return fmt.Sprintf("lease %q fence %d owner %q", l.name, l.fence, l.owner)
}
