package leases

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
)

// Every error the package returns reads "leases: ..." (the package's name
// once, first), also when it wraps another package's (fencing's, from Once
// and OnceTx) or is the cause of a lease's context; an error that fn
// returns to Run, Lead, Once or OnceTx is returned as it is. Match them with
// errors.Is and errors.As, not by their text.
var (
	// ErrHeld is returned by TryAcquire when another owner holds the lease.
	// The error is a *HeldError naming the holder; errors.Is(err, ErrHeld)
	// and errors.As(err, &heldErr) both work.
	ErrHeld = errors.New("leases: lease held by another owner")

	// ErrLost is the cause of a lease's context when the lease is no longer
	// (safely) held: a renewal matched no row (expired by the database clock,
	// force-released or taken over), or the local deadline passed without a
	// successful renewal. Run returns an error wrapping it when the lease was
	// lost while fn ran.
	ErrLost = errors.New("leases: lease lost")

	// ErrReleased is the cause of a lease's context after Release (or after
	// Close released it).
	ErrReleased = errors.New("leases: lease released")

	// ErrHandover is the cause of a lease's context when an operator asked
	// the grant to hand the lease over (Client.RequestHandover, `pgfence
	// leases handover`). The lease is still held and renewed: stop the work
	// and Release it (Run and Lead do), and a waiter takes over.
	ErrHandover = errors.New("leases: hand-over requested")

	// ErrHandoverTimeout is returned by RequestHandover when the holder did
	// not release within its timeout. It still holds the lease: nothing was
	// forced. A wait cut short by the context wraps the context's error
	// instead.
	ErrHandoverTimeout = errors.New("leases: holder did not hand over in time")

	// ErrClosed is returned by a Client's methods after Close, and is part of
	// the cause of the contexts of leases that Close released.
	ErrClosed = errors.New("leases: client closed")

	// ErrNotHeld is returned by Get and ForceRelease when nobody holds the
	// lease (no row, or its expires_at has passed by the database clock).
	ErrNotHeld = errors.New("leases: lease not held")

	// ErrInvalid matches every bad-input error (an empty, oversized or
	// NUL-containing name, a TTL below MinTTL, a nil pool, an invalid
	// option): the call wrote nothing and retrying it cannot help. The
	// error's message names the setting and the value.
	ErrInvalid = errors.New("leases: invalid input")
)

// ErrBlocked is returned by ForceRelease when the lease stayed locked — its
// fence lock, or under REPEATABLE READ or SERIALIZABLE its row, held by a
// holder's open fenced transaction, typically a frozen one, or a prepared
// one — past its timeout. The error is a *BlockedError naming what is in
// the way.
var ErrBlocked = errors.New("leases: force-release blocked")

// Backend describes a PostgreSQL backend (a session), as pg_stat_activity
// shows it to the caller's role.
type Backend struct {
	PID         int64
	Application string    // application_name
	ClientAddr  string    // empty for a Unix socket, or when not visible
	Since       time.Time // start of its current transaction; zero if not visible
}

// PreparedTransaction describes a prepared transaction (two-phase commit's
// PREPARE TRANSACTION), as pg_prepared_xacts shows it. It belongs to no
// backend: it survives its session and a server restart, and only COMMIT
// PREPARED or ROLLBACK PREPARED with its GID ends it.
type PreparedTransaction struct {
	GID      string    // its global transaction identifier
	Owner    string    // the role that prepared it
	Prepared time.Time // when it was prepared
}

// BlockedError is ForceRelease's error when the lease stayed locked past
// the timeout. It matches ErrBlocked with errors.Is.
type BlockedError struct {
	Name string
	// Blockers are the backends that held the lock, as last seen while
	// waiting — not those merely queued ahead for it, as a waiting
	// takeover is; empty if none could be seen in time.
	Blockers []Backend
	// Prepared are the prepared transactions that held the lease's fence
	// lock when the wait ended: a fenced write prepared and never
	// committed or rolled back. Ending a backend does not end them.
	Prepared []PreparedTransaction
}

// Error names the lease and what blocks it: backends, prepared transactions.
func (e *BlockedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "leases: force-release %q: lease locked", e.Name)
	sep := func(i int) {
		if i == 0 {
			b.WriteString(" by")
		} else {
			b.WriteString(",")
		}
	}
	for i, k := range e.Blockers {
		sep(i)
		fmt.Fprintf(&b, " pid %d", k.PID)
		if k.Application != "" {
			fmt.Fprintf(&b, " (%s)", k.Application)
		}
		if k.ClientAddr != "" {
			fmt.Fprintf(&b, " from %s", k.ClientAddr)
		}
		if !k.Since.IsZero() {
			fmt.Fprintf(&b, " in a transaction since %s", k.Since.UTC().Format(time.RFC3339))
		}
	}
	for i, p := range e.Prepared {
		sep(len(e.Blockers) + i)
		fmt.Fprintf(&b, " prepared transaction %q (owner %q, prepared %s)", p.GID, p.Owner, p.Prepared.UTC().Format(time.RFC3339))
	}
	return b.String()
}

// Is reports whether target is ErrBlocked.
func (e *BlockedError) Is(target error) bool { return target == ErrBlocked }

// isLockTimeout reports whether err is PostgreSQL's lock_not_available.
func isLockTimeout(err error) bool { return pgerr.Code(err) == pgerr.LockNotAvailable }

// HeldError is the error TryAcquire (and Semaphore.TryAcquire) returns
// when the lease, or every slot, cannot be taken now. It matches ErrHeld
// with errors.Is.
type HeldError struct {
	// Holder describes the current grant, as read in the same statement
	// that failed to take the lease: for a semaphore, the live slot that
	// frees first. A semaphore can also have no slot to give and no live
	// holder, when the row or fence lock of each slot it could grant is
	// held — by a taker granting that slot at this moment, or by a former
	// holder's fenced transaction still open. Holder then has only Name,
	// the semaphore's, with an empty Owner and zero Fence; a slot is likely
	// free in a moment (Semaphore.Acquire looks again after 50ms).
	Holder Info
}

// Error names the lease, its holder and the holder's fence; or the
// semaphore whose slots are busy with no live holder.
func (e *HeldError) Error() string {
	if e.Holder.Owner == "" {
		return fmt.Sprintf("leases: semaphore %q: no live holder, yet no slot free to take: "+
			"each is locked, by a taker granting it or by a former holder's open fenced transaction", e.Holder.Name)
	}
	return fmt.Sprintf("leases: lease %q held by %q (fence %d) until %s",
		e.Holder.Name, e.Holder.Owner, e.Holder.Fence, e.Holder.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Is reports whether target is ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// prefixed returns err reading "leases: ..." once: as it is when it does
// already (the cause of a lease's context, say), else wrapped.
func prefixed(err error) error { return within("", err) }

// within is prefixed, saying what the client was doing (op, if not empty)
// when it wraps: an error of package fencing, say.
func within(op string, err error) error {
	switch {
	case strings.HasPrefix(err.Error(), "leases: "):
		return err
	case op == "":
		return fmt.Errorf("leases: %w", err)
	}
	return fmt.Errorf("leases: %s: %w", op, err)
}

// dbError wraps an error from PostgreSQL with what the client was doing,
// adding a hint when the likely cause is known (internal/pgerr).
func dbError(op string, err error) error {
	return fmt.Errorf("leases: %s: %w", op, pgerr.WithHint(err))
}

// permanent reports whether err will not go away by retrying: bad input
// (the client's checks, or PostgreSQL's data exceptions), a closed client,
// or a missing schema or privilege. Lead stops on these and retries
// anything else.
func permanent(err error) bool {
	return errors.Is(err, ErrInvalid) || errors.Is(err, ErrClosed) || pgerr.Permanent(err)
}
