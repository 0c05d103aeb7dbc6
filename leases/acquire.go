package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"
)

// Waiting acquirers of one name in one Client form a queue. Only the head
// talks to PostgreSQL; the others wait until the head obtains the lease or
// gives up, so that a release costs one attempt per Client, not one per
// waiter. The head attempts, and when the lease is held sleeps until a
// notification for the name, a local release, the holder's expiry by the
// database clock, or a jittered poll.

type queue struct {
	waiters []*waiter // waiters[0] is the head
}

// A Client's queues are keyed by the lease's name, or for a semaphore's
// waiters by semQueue of the semaphore's name: a lease and a semaphore of
// one name are different things, and neither's waiters may wait behind the
// other's head. A NUL, which no lease name holds, keeps the keys apart.
const semQueuePrefix = "\x00"

// semQueue is the queue key of the waiters of semaphore name.
func semQueue(name string) string { return semQueuePrefix + name }

// queueName is the lease or semaphore name of queue key key.
func queueName(key string) string { return strings.TrimPrefix(key, semQueuePrefix) }

type waiter struct {
	wake chan struct{} // buffered 1; sent without blocking
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// enqueue adds a waiter to queue key; the head is signalled at once.
func (c *Client) enqueue(key string) *waiter {
	w := &waiter{wake: make(chan struct{}, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queues[key]
	if q == nil {
		q = &queue{}
		c.queues[key] = q
	}
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		signal(w.wake)
	}
	return w
}

// dequeue removes w from queue key; if w was the head, the next waiter
// becomes head and is signalled.
func (c *Client) dequeue(key string, w *waiter) {
	c.mu.Lock()
	q := c.queues[key]
	if q == nil {
		c.mu.Unlock()
		return
	}
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			if i == 0 && len(q.waiters) > 0 {
				signal(q.waiters[0].wake)
			}
			break
		}
	}
	last := len(q.waiters) == 0
	if last {
		delete(c.queues, key)
	}
	c.mu.Unlock()
	if last {
		c.unwantLater(queueName(key))
	}
}

// holdsLocally reports whether this client holds name right now, or is
// releasing it (the release has not committed yet).
func (c *Client) holdsLocally(name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.held[name]
	return l != nil && l.state == stateHeld || c.releasing[name] > 0
}

// wakeQueue signals the head waiter of queue key, if any.
func (c *Client) wakeQueue(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if q := c.queues[key]; q != nil && len(q.waiters) > 0 {
		signal(q.waiters[0].wake)
	}
}

// Acquire takes the named lease for ttl, waiting while another owner holds
// it. It returns when the lease is granted, when ctx ends (ctx's error), on
// a database error, or with ErrClosed when the client closes. ctx bounds
// only the waiting: the lease's own lifetime is its Context. A waiter wakes
// on a release notification (within a round trip), on a release by this
// client, when the holder's grant expires by the database clock, and on a
// jittered poll (see WithPollInterval). Bad input (name, ttl < MinTTL)
// returns an error naming the setting and writes nothing. opts configure
// the grant (WithData). If ctx ends while an attempt's statement runs, the
// attempt is cancelled and its answer awaited (package doc, "Failure
// handling"): the lease is returned if the grant committed first.
func (c *Client) Acquire(ctx context.Context, name string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	return c.take(ctx, name, ttl, opts, false, func(ctx context.Context, ac acquireConfig) (*Lease, error) {
		return c.acquire(ctx, name, ttl, ac)
	})
}

// take is Acquire and TryAcquire around attempt: it validates the input,
// then runs attempt in the acquire span and records its outcome.
func (c *Client) take(ctx context.Context, name string, ttl time.Duration, opts []AcquireOption, try bool,
	attempt func(ctx context.Context, ac acquireConfig) (*Lease, error)) (*Lease, error) {
	if err := validate(name, ttl); err != nil {
		return nil, err
	}
	ac, err := acquireOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := c.usable(ctx); err != nil {
		return nil, err
	}
	return c.grantCall(ctx, name, try, func(ctx context.Context) (*Lease, error) {
		sctx, span := c.tr.Start(ctx, spanAcquire, name, 0)
		l, err := attempt(sctx, ac)
		span.End(fenceOf(l), err)
		return l, err
	})
}

// grantCall runs attempt, a grant call of lease or semaphore name, inside
// enter (Close cuts it short and waits for it), and records its outcome.
func (c *Client) grantCall(ctx context.Context, name string, try bool, attempt func(ctx context.Context) (*Lease, error)) (*Lease, error) {
	actx, leave, err := c.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	start := time.Now()
	l, err := attempt(actx)
	c.m.recordAcquire(ctx, name, try, acquireOutcomeOf(ctx, l, err), start)
	return l, err
}

// enter begins a grant call, which Close cuts short and waits for: it
// returns ctx, also ended (cause ErrClosed) when Close begins, and leave,
// to call when the call is done — its grant settled (settle.go), and, if
// it committed, kept as a Lease or ended again. It fails with ErrClosed
// if Close has begun.
//
// A ctx that never ends (context.Background) is returned as it is, and
// Close neither cuts the call short nor waits for it: such a grant takes
// the fast path, without settle's goroutine (13 allocations and a
// goroutine hand-off per grant), runs until the server answers, and, if it
// committed after Close began, is ended then (granted).
func (c *Client) enter(ctx context.Context) (context.Context, func(), error) {
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		return nil, nil, ErrClosed
	}
	if ctx.Done() == nil {
		c.mu.Unlock()
		return ctx, func() {}, nil
	}
	c.wg.Add(1)
	c.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(c.shutdown, func() { cancel(ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		c.wg.Done()
	}, nil
}

// acquire is Acquire after validation.
func (c *Client) acquire(ctx context.Context, name string, ttl time.Duration, ac acquireConfig) (*Lease, error) {
	return c.await(ctx, name, true, func(ctx context.Context) (*Lease, Info, time.Duration, error) {
		return c.grant(ctx, name, ttl, ac)
	})
}

// await queues up as a waiter on name (a lease's, or a semaphore's)
// and, once head, calls try until it grants a lease, sleeping between
// attempts as Acquire describes. exclusive says that one grant at a time
// exists for name, so that no attempt is made while this client holds it.
func (c *Client) await(ctx context.Context, name string, exclusive bool,
	try func(ctx context.Context) (*Lease, Info, time.Duration, error)) (*Lease, error) {
	key := name
	if !exclusive {
		key = semQueue(name)
	}
	w := c.enqueue(key)
	defer c.dequeue(key, w)
	// Become head.
	select {
	case <-w.wake:
	case <-ctx.Done():
		return nil, fmt.Errorf("leases: acquire %q: %w", name, context.Cause(ctx))
	case <-c.shutdown.Done():
		return nil, fmt.Errorf("leases: acquire %q: %w", name, ErrClosed)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	missed := 0 // attempts in a row made without the wait key (want)
	for attempt := 0; ; attempt++ {
		if exclusive && c.holdsLocally(name) {
			// Another caller of this client holds it: an attempt could
			// only fail. Its release, or its loss, wakes this queue; the
			// poll interval bounds the wait in any case.
			if c.hooks.onWait != nil {
				c.hooks.onWait(name)
			}
			timer.Reset(jitter(c.cfg.pollInterval))
			select {
			case <-w.wake:
			case <-timer.C:
			case <-ctx.Done():
				return nil, fmt.Errorf("leases: acquire %q: %w", name, context.Cause(ctx))
			case <-c.shutdown.Done():
				return nil, fmt.Errorf("leases: acquire %q: %w", name, ErrClosed)
			}
			continue
		}
		if c.want(ctx, name) { // before the attempt: see interest.go
			missed = 0
		} else {
			missed++
		}
		l, holder, remaining, err := try(ctx)
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, errInDoubt) {
				return nil, fmt.Errorf("leases: acquire %q: %w", name, context.Cause(ctx))
			}
			return nil, err
		}
		if l != nil {
			return l, nil
		}
		c.startListener()
		delay := c.pollDelay(attempt, missed, remaining)
		c.log.Debug("leases: waiting", "name", name, "holder", holder.Owner, "fence", holder.Fence, "poll", delay)
		if c.hooks.onWait != nil {
			c.hooks.onWait(name)
		}
		timer.Reset(delay)
		select {
		case <-w.wake:
		case <-timer.C:
		case <-ctx.Done():
			return nil, fmt.Errorf("leases: acquire %q: %w", name, context.Cause(ctx))
		case <-c.shutdown.Done():
			return nil, fmt.Errorf("leases: acquire %q: %w", name, ErrClosed)
		}
	}
}

// TryAcquire takes the named lease for ttl if nobody holds it, in one
// statement. If another owner holds it, it returns a *HeldError (matching
// ErrHeld) naming the holder. ctx bounds the statement only: if it ends
// first, the statement is cancelled and its answer awaited (package doc,
// "Failure handling"), so that an error leaves nothing held. Bad input
// returns an error naming the setting and writes nothing. opts configure
// the grant (WithData); the HeldError's Holder carries the holder's data.
//
// Taking over a grant that has expired waits for its holder's open fenced
// transactions to end (the fence lock, in package fencing: their writes
// commit before the new grant, or never), however long ctx allows. Keep
// fenced transactions short.
func (c *Client) TryAcquire(ctx context.Context, name string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	return c.take(ctx, name, ttl, opts, true, func(ctx context.Context, ac acquireConfig) (*Lease, error) {
		l, holder, _, err := c.grant(ctx, name, ttl, ac)
		if err == nil && l == nil {
			err = &HeldError{Holder: holder}
		}
		return l, err
	})
}

// fenceOf is l's fence, or 0 for no lease.
func fenceOf(l *Lease) int64 {
	if l == nil {
		return 0
	}
	return l.fence
}

func validate(name string, ttl time.Duration) error {
	if err := validateName(name); err != nil {
		return err
	}
	return validateTTL(ttl)
}

func (c *Client) usable(ctx context.Context) error {
	if c == nil {
		return invalid("leases: client is nil")
	}
	if ctx == nil {
		return invalid("leases: context must not be nil")
	}
	if c.isClosed() {
		return ErrClosed
	}
	if ctx.Err() != nil {
		return prefixed(context.Cause(ctx))
	}
	return nil
}

// grant runs one acquire attempt. It returns the lease if granted, or else
// the holder and the time until the holder's grant expires (server clock).
func (c *Client) grant(ctx context.Context, name string, ttl time.Duration, ac acquireConfig) (*Lease, Info, time.Duration, error) {
	if err := c.checkEncoding(ctx, "acquire", name, string(ac.data)); err != nil {
		return nil, Info{}, 0, err
	}
	owner := c.newOwner()
	data := dataArg(ac.data)
	for range 3 {
		start := time.Now()
		// One value for the row's columns, which escape to the driver: an
		// allocation per cycle rather than one per column.
		var row struct {
			info        Info
			granted     bool
			remainingUS int64
			stmtAt      time.Time
		}
		row.info.Name = name
		err := c.queryGrant(ctx, sqlGrant, []any{name, owner, ttl.Microseconds(), data}, &row.granted,
			&row.info.Owner, &row.info.Fence, &row.info.AcquiredAt, &row.info.RenewedAt, &row.info.ExpiresAt,
			&row.remainingUS, &row.info.Data, &row.stmtAt)
		info, granted, remainingUS, stmtAt := row.info, row.granted, row.remainingUS, row.stmtAt
		if err != nil && ctx.Err() != nil {
			return nil, Info{}, 0, c.gaveUp(ctx, fmt.Sprintf("acquire %q", name), owner, err)
		}
		if errors.Is(err, errNoRows) {
			// The holder committed after this statement's snapshot was
			// taken (or released just now): look again.
			continue
		}
		if err != nil {
			c.endUnread(ctx, name, owner, false, err)
			return nil, Info{}, 0, dbError(fmt.Sprintf("acquire %q", name), err)
		}
		remaining := time.Duration(remainingUS) * time.Microsecond
		if !granted {
			return nil, info, remaining, nil
		}
		l, err := c.granted(ctx, info, ttl, grantStart(start, stmtAt, info.ExpiresAt, ttl), "", 0, ac.data)
		return l, info, remaining, err
	}
	// Three snapshots in a row missed a holder that keeps changing; report
	// it as held, with a short retry.
	return nil, Info{Name: name}, 0, nil
}

// grantStart is when a grant's TTL began on the local clock, for a request
// sent at sent: later by the time the server spent in the statement before
// it set the expiry, from the statement's start (stmtAt) to the expiry's
// base (expiresAt − ttl), both by the database clock. A takeover waits
// there for the former holder's fenced transactions, for as long as they
// stay open: counting from sent would leave it a lease that is past its
// local deadline when it arrives. The statement began after the request
// was sent, so the deadline still comes before the server's expiry; the
// wait is bounded by the round trip seen here, so a database clock that
// steps during the statement gains the lease no more than that.
func grantStart(sent, stmtAt, expiresAt time.Time, ttl time.Duration) time.Time {
	waited := expiresAt.Add(-ttl.Truncate(time.Microsecond)).Sub(stmtAt)
	if waited <= 0 {
		return sent
	}
	return sent.Add(min(waited, time.Since(sent)))
}

// granted keeps alive the grant info of ttl, whose request began at start,
// as a Lease: of slot slot of semaphore sem, if sem is not empty. If Close
// has begun, it ends the grant and fails with ErrClosed.
func (c *Client) granted(ctx context.Context, info Info, ttl time.Duration, start time.Time, sem string, slot int, data json.RawMessage) (*Lease, error) {
	l := c.newLease(info, ttl, time.Now())
	l.sem, l.slot, l.data = sem, slot, data
	if err := c.register(l, start); err != nil {
		l.cancel(fmt.Errorf("%w: %w", ErrReleased, ErrClosed))
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.releaseTimeout)
		defer cancel()
		_, _ = c.releaseBatch(rctx, "release after close", []*Lease{l})
		return nil, fmt.Errorf("leases: acquire %q: %w", info.Name, err)
	}
	if c.log.Enabled(ctx, slog.LevelDebug) {
		c.log.Debug("leases: acquired", "name", info.Name, "owner", info.Owner, "fence", info.Fence, "ttl", ttl)
	}
	return l, nil
}

func (c *Client) newLease(info Info, ttl time.Duration, since time.Time) *Lease {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{
		c:          c,
		name:       info.Name,
		owner:      info.Owner,
		fence:      info.Fence,
		ttl:        ttl,
		since:      since,
		ctx:        ctx,
		cancel:     cancel,
		acquiredAt: info.AcquiredAt,
		expiresAt:  info.ExpiresAt,
	}
}

// pollDelay is how long a waiting head sleeps without a wake-up: until
// just after the holder's expiry (server clock), but no longer than the
// poll interval — or, while no listener is active (by attempt) or the
// last missed attempts were made without the wait key (by missed), a
// backoff from 50ms up to the poll interval. Jittered so that clients do
// not poll in step.
func (c *Client) pollDelay(attempt, missed int, remaining time.Duration) time.Duration {
	c.mu.Lock()
	listening := c.listenOK
	c.mu.Unlock()
	d := c.cfg.pollInterval
	switch {
	case !listening:
		d = min(d, backoff(attempt))
	case missed > 0:
		d = min(d, backoff(missed-1))
	}
	d = jitter(d)
	// Wake just after the holder's expiry; a few ms of jitter spreads
	// clients.
	return min(d, max(remaining, 0)+time.Millisecond+time.Duration(rand.Int64N(int64(10*time.Millisecond))))
}

// backoff is the n-th delay of a backoff from 50ms, doubling.
func backoff(n int) time.Duration {
	return 50 * time.Millisecond << min(n, 16)
}

// jitter returns a duration in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
