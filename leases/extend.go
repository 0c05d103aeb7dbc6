package leases

import (
	"context"
	"fmt"
	"time"
)

// Extend renews the lease now with a new TTL (ShedLock's extendActiveLock):
// PostgreSQL sets expires_at to its clock plus ttl, and from then on the
// keepalive renews with ttl. The local deadline is recomputed by the same
// rule as for every renewal — start of this request + ttl − ttl/10 — and
// replaces the old one even when it is sooner (a shorter ttl), so that it
// always falls before the server's expires_at. It waits for row locks as
// long as ctx allows, and is serialised with the keepalive's renewals of
// this lease.
//
// It returns nil on success; an error wrapping ErrInvalid (and changes
// nothing) for ttl < MinTTL; an error wrapping ErrLost (and the lease is
// lost) if the grant is gone; Err() if the lease is no longer held; and
// another error if PostgreSQL could not be reached or ctx ended. A longer
// ttl then changed nothing here; a shorter one may have been committed
// all the same (an answer lost is not a statement undone), so the lease
// keeps it as if it had: renewed with ttl, its local deadline from this
// request. Safe to repeat.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l == nil || ctx == nil {
		return invalid("leases: extend: lease and context must not be nil")
	}
	if err := validateTTL(ttl); err != nil {
		return err
	}
	if err := l.heldErr(); err != nil {
		return err
	}
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	c := l.c
	start := time.Now()
	c.mu.Lock()
	if l.state == stateHeld && ttl < l.ttl {
		// Shorter: kept from now on, whatever the answer (see above).
		// The server's expires_at is then this request's, or a later
		// one's, or the old one: each after this deadline.
		l.ttl = ttl
		if d := start.Add(ttl - margin(ttl)); d.Before(l.deadline) {
			c.setDeadlineLocked(l, d)
		}
		if next := start.Add(ttl / 3); next.Before(l.nextRenew) {
			l.nextRenew = next
			if c.nextDue.IsZero() || next.Before(c.nextDue) {
				c.nextDue = next
				c.kickKeepalive()
			}
		}
	}
	c.mu.Unlock()
	var expiresAt *time.Time
	ctx, span := c.tr.Start(ctx, spanRenew, l.name, l.fence)
	err := c.q.QueryRow(ctx, sqlRenew, l.name, l.owner, l.fence, ttl.Microseconds()).Scan(&expiresAt)
	span.End(0, err)
	if err == nil && expiresAt == nil {
		c.m.recordRenewal(l.name, renewLost)
		lost := l.goneErr("extend")
		c.lose(l, lostRenewRejected, lost, false)
		return l.Err()
	}
	if err != nil {
		c.m.recordRenewal(l.name, renewError)
		return dbError(fmt.Sprintf("extend %q", l.name), err)
	}
	c.m.recordRenewal(l.name, renewRenewed)
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.state != stateHeld {
		return l.errLocked()
	}
	if !time.Now().Before(l.deadline) {
		// The answer came after the old deadline: the lease is being lost
		// (its deadline is due); the new grant does not revive it.
		return fmt.Errorf("leases: extend %q: the answer arrived after the local deadline: %w", l.name, ErrLost)
	}
	// renewMu makes this the newest renewal of the grant: its deadline
	// holds, later or sooner.
	l.ttl = ttl
	c.setDeadlineLocked(l, start.Add(ttl-margin(ttl)))
	l.nextRenew = start.Add(ttl / 3)
	l.expiresAt = *expiresAt
	if c.nextDue.IsZero() || l.nextRenew.Before(c.nextDue) {
		c.nextDue = l.nextRenew
		c.kickKeepalive()
	}
	return nil
}
