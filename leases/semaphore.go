package leases

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// A semaphore is a name with N slots: up to N holders at once. Slot k is
// the lease "<name>#<k>" (k from 1 to N), so each grant of a slot is an
// ordinary Lease — renewed by the keepalive, released by Release, lost as
// any lease is — with its own fence, and its Token works with package
// fencing unchanged: fences increase per slot, and a stale holder of a slot
// is rejected as a stale holder of a lease would be.
//
// Acquiring is one call of pgfence.try_acquire_slot (migration 6), which
// grants the lowest-numbered slot that has never been granted or whose
// grant has expired, passing over rows that are locked (by another taker,
// or by a former holder's open fenced transaction) rather than waiting.
// Waiters queue on the semaphore's name (apart from waiters for a lease of
// that name, a different thing): a release of any slot notifies
// the waiters of the semaphore (pgfence.notify_waiters wakes the holders
// of the semaphore name's wait key), and a waiter also wakes when the
// first slot expires, and polls.

// MaxSlots is the most slots a semaphore may have.
const MaxSlots = 1000

// lockedSlotRetry is how soon a waiter looks again when no slot is live
// but none was free to take.
const lockedSlotRetry = 50 * time.Millisecond

// Semaphore is a named semaphore with a fixed number of slots, over a
// Client. Every process that uses the name must give the same number of
// slots: a caller counts only slots 1..N of its own N. A Semaphore is safe
// for concurrent use; it holds no state of its own besides its name and
// size, so creating one is free.
type Semaphore struct {
	c     *Client
	name  string
	slots int
}

// Semaphore returns the semaphore name with slots slots. It fails with
// ErrInvalid when name is not a valid lease name, slots is not between 1
// and MaxSlots, or the longest slot's lease name ("<name>#<slots>") would
// exceed MaxNameLen bytes. It does not touch the database.
func (c *Client) Semaphore(name string, slots int) (*Semaphore, error) {
	if c == nil {
		return nil, invalid("leases: client is nil")
	}
	if err := validateName(name); err != nil {
		return nil, err
	}
	if slots < 1 || slots > MaxSlots {
		return nil, invalid(fmt.Sprintf("leases: semaphore slots must be between 1 and %d, got %d", MaxSlots, slots))
	}
	if n := len(slotName(name, slots)); n > MaxNameLen {
		return nil, invalid(fmt.Sprintf("leases: semaphore name must leave room for \"#%d\" within %d bytes, got %d bytes", slots, MaxNameLen, len(name)))
	}
	return &Semaphore{c: c, name: name, slots: slots}, nil
}

// checkTTL validates ttl and checks that the client is usable.
func (c *Client) checkTTL(ctx context.Context, ttl time.Duration) error {
	if err := validateTTL(ttl); err != nil {
		return err
	}
	return c.usable(ctx)
}

// slotName is the lease name of slot k of semaphore name.
func slotName(name string, k int) string { return name + "#" + strconv.Itoa(k) }

// errNilSemaphore is the error of every call on a nil *Semaphore.
func errNilSemaphore() error { return invalid("leases: semaphore is nil") }

// Name returns the semaphore's name ("" for a nil Semaphore).
func (s *Semaphore) Name() string {
	if s == nil {
		return ""
	}
	return s.name
}

// Slots returns the number of slots (0 for a nil Semaphore).
func (s *Semaphore) Slots() int {
	if s == nil {
		return 0
	}
	return s.slots
}

// Acquire takes a free slot for ttl, waiting while all slots are held. It
// returns the slot's Lease (Name "<name>#<k>", Slot k) when granted, ctx's
// error when ctx ends, a database error, or ErrClosed when the client
// closes. ctx bounds only the waiting. Waiters wake when any slot is
// released (notification), when the first-expiring slot expires by the
// database clock, and on a jittered poll (WithPollInterval). Within one
// Client, waiters on a semaphore queue up and only the head attempts.
func (s *Semaphore) Acquire(ctx context.Context, ttl time.Duration) (*Lease, error) {
	if s == nil {
		return nil, errNilSemaphore()
	}
	c := s.c
	if err := c.checkTTL(ctx, ttl); err != nil {
		return nil, err
	}
	return c.grantCall(ctx, s.name, false, func(ctx context.Context) (*Lease, error) {
		return c.await(ctx, s.name, false, func(ctx context.Context) (*Lease, Info, time.Duration, error) {
			return s.grant(ctx, ttl)
		})
	})
}

// TryAcquire takes a free slot for ttl, in one statement, if there is one.
// When all slots are held it returns a *HeldError (matching ErrHeld) that
// names the slot whose grant expires first. When no slot is held but none
// can be taken (each is locked: a taker granting it, or a former holder's
// fenced transaction still open), the *HeldError has no holder: its
// Holder has only Name, the semaphore's, and an empty Owner (HeldError
// says more). ctx bounds the statement.
func (s *Semaphore) TryAcquire(ctx context.Context, ttl time.Duration) (*Lease, error) {
	if s == nil {
		return nil, errNilSemaphore()
	}
	c := s.c
	if err := c.checkTTL(ctx, ttl); err != nil {
		return nil, err
	}
	return c.grantCall(ctx, s.name, true, func(ctx context.Context) (*Lease, error) {
		l, holder, _, err := s.grant(ctx, ttl)
		if err == nil && l == nil {
			err = &HeldError{Holder: holder}
		}
		return l, err
	})
}

// Run takes a slot (waiting, like Acquire), runs fn under it and releases
// it, as Client.Run does for a lease.
func (s *Semaphore) Run(ctx context.Context, ttl time.Duration, fn func(ctx context.Context, l *Lease) error) error {
	if s == nil {
		return errNilSemaphore()
	}
	if fn == nil {
		return invalid("leases: fn must not be nil")
	}
	l, err := s.Acquire(ctx, ttl)
	if err != nil {
		return err
	}
	return s.c.runHeld(ctx, l, fn)
}

// Holders returns the live grants of the semaphore's slots, by slot
// number. ctx bounds the query.
func (s *Semaphore) Holders(ctx context.Context) ([]Info, error) {
	if s == nil {
		return nil, errNilSemaphore()
	}
	if err := s.c.usable(ctx); err != nil {
		return nil, err
	}
	if err := s.c.checkEncoding(ctx, "holders of semaphore", s.name); err != nil {
		return nil, err
	}
	rows, err := s.c.q.Query(ctx, sqlSlots, s.name, s.slots)
	if err != nil {
		return nil, dbError(fmt.Sprintf("holders of semaphore %q", s.name), err)
	}
	infos, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Info, error) {
		var i Info
		err := row.Scan(&i.Name, &i.Owner, &i.Fence, &i.AcquiredAt, &i.RenewedAt, &i.ExpiresAt)
		return i, err
	})
	if err != nil {
		return nil, dbError(fmt.Sprintf("holders of semaphore %q", s.name), err)
	}
	return infos, nil
}

// grant runs one attempt at a slot. It returns the slot's lease if
// granted, or else the holder of the slot that frees first and the time to
// its expiry (zero when no slot is live but none was free to take).
func (s *Semaphore) grant(ctx context.Context, ttl time.Duration) (*Lease, Info, time.Duration, error) {
	c := s.c
	if err := c.checkEncoding(ctx, "acquire a slot of semaphore", s.name); err != nil {
		return nil, Info{}, 0, err
	}
	owner := c.newOwner()
	start := time.Now()
	var (
		granted     bool
		slot        *int32
		lease       *string
		holder      *string
		fence       *int64
		acquired    *time.Time
		renewed     *time.Time
		expires     *time.Time
		remainingUS int64
	)
	err := c.queryGrant(ctx, sqlGrantSlot, []any{s.name, s.slots, owner, ttl.Microseconds()}, &granted,
		&slot, &lease, &holder, &fence, &acquired, &renewed, &expires, &remainingUS)
	if err != nil && ctx.Err() != nil {
		return nil, Info{}, 0, c.gaveUp(ctx, fmt.Sprintf("acquire a slot of semaphore %q", s.name), owner, err)
	}
	if err != nil {
		if errors.Is(err, errNoRows) {
			err = errors.New("pgfence.try_acquire_slot returned no row")
		} else {
			c.endUnread(ctx, s.name, owner, true, err)
		}
		return nil, Info{}, 0, dbError(fmt.Sprintf("acquire a slot of semaphore %q", s.name), err)
	}
	info := Info{Name: s.name}
	if lease != nil {
		info = Info{Name: *lease, Owner: *holder, Fence: *fence, AcquiredAt: *acquired, RenewedAt: *renewed, ExpiresAt: *expires}
	}
	remaining := time.Duration(remainingUS) * time.Microsecond
	if lease == nil {
		// Nothing live, nothing free to take: an expired slot's row is
		// locked, by a taker that commits in a moment or by a former
		// holder's open fenced transaction. Look again shortly.
		remaining = lockedSlotRetry
	}
	if !granted {
		return nil, info, remaining, nil
	}
	l, err := c.granted(ctx, info, ttl, start, s.name, int(*slot), nil)
	return l, info, remaining, err
}

// Slot returns the number of the semaphore slot this grant holds (from 1),
// or 0 when it is a plain lease.
func (l *Lease) Slot() int {
	if l == nil {
		return 0
	}
	return l.slot
}

// queue is the key of the queue whose head a change of this grant wakes:
// the semaphore's for a slot, else the lease's.
func (l *Lease) queue() string {
	if l.sem != "" {
		return semQueue(l.sem)
	}
	return l.name
}
