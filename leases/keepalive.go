package leases

import (
	"context"
	"fmt"
	"time"
)

// The keepalive is one goroutine per Client. It sleeps until the earliest
// lease is due (its last request start + TTL/3), then renews every lease
// due within the next TTL/12 with one statement, so leases coalesce into
// few ticks however many there are. Each lease also has a local deadline,
// watched by one timer per Client (deadline.go); if it passes before a
// renewal succeeds, the lease is lost. Renewal failures other than "no
// row" are retried with a short backoff until then.

const (
	retryMin = 25 * time.Millisecond
	retryMax = time.Second
)

// register starts keeping l alive: l was granted by a request that began
// at start. It fails with ErrClosed if Close has begun (the caller then
// releases the grant).
func (c *Client) register(l *Lease, start time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed() {
		return ErrClosed
	}
	c.setDeadlineLocked(l, start.Add(l.ttl-margin(l.ttl)))
	l.nextRenew = start.Add(l.ttl / 3)
	c.held[l.name] = l
	if c.nextDue.IsZero() || l.nextRenew.Before(c.nextDue) {
		c.nextDue = l.nextRenew
		c.kickKeepalive()
	}
	return nil
}

// renewedLocked records a successful renewal whose request began at start.
// A renewal that arrives after the local deadline does not revive the lease.
func (c *Client) renewedLocked(l *Lease, start time.Time, expiresAt time.Time) {
	if l.state != stateHeld || !time.Now().Before(l.deadline) {
		return
	}
	deadline := start.Add(l.ttl - margin(l.ttl))
	if !deadline.After(l.deadline) {
		return // an older request than the one already recorded
	}
	c.setDeadlineLocked(l, deadline)
	l.nextRenew = start.Add(l.ttl / 3)
	l.expiresAt = expiresAt
}

// dropLocked stops keeping l alive.
func (c *Client) dropLocked(l *Lease) {
	if c.held[l.name] == l {
		delete(c.held, l.name)
	}
	c.unwatchLocked(l)
}

// lose marks l lost with cause (which wraps ErrLost), records the loss
// (why, as the caller that found it knows it) and wakes local waiters.
// orphan says the row may still be ours (lost at the local deadline): the
// keepalive expires it so that waiters need not wait for the server's
// expiry.
func (c *Client) lose(l *Lease, why lostCause, cause error, orphan bool) {
	c.mu.Lock()
	if l.state != stateHeld {
		c.mu.Unlock()
		return
	}
	l.state = stateLost
	c.dropLocked(l)
	// Recorded before the context ends, so that whoever sees it done sees
	// them.
	end := time.Now()
	c.m.recordHold(l, true, end)
	c.m.recordLost(l.name, why)
	l.cancel(cause)
	if orphan && !c.hooks.noKeepalive && !c.isClosed() {
		c.orphans = append(c.orphans, l)
		c.kickKeepalive()
	}
	c.mu.Unlock()
	c.log.Warn("leases: lease lost", "name", l.name, "owner", l.owner, "fence", l.fence,
		"cause", lostCauseNames[why], "held", end.Sub(l.since), "err", cause)
	c.wakeQueue(l.queue())
}

// onDeadline loses l, taken off the deadline heap by onDeadlines, unless
// it is gone or its deadline has moved since (whatever moves it,
// setDeadlineLocked, put it back on the heap).
func (c *Client) onDeadline(l *Lease) {
	c.mu.Lock()
	stale := l.state != stateHeld || time.Now().Before(l.deadline)
	ttl := l.ttl
	c.mu.Unlock()
	if stale {
		return
	}
	c.lose(l, lostDeadline, fmt.Errorf("lease %q (fence %d): no successful renewal before the local deadline (TTL %s − margin %s): %w",
		l.name, l.fence, ttl, margin(ttl), ErrLost), true)
}

func (c *Client) kickKeepalive() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// keepalive is the client's renewal goroutine.
func (c *Client) keepalive() {
	defer c.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	retry := retryMin
	var retryAt time.Time
	for {
		c.mu.Lock()
		wake := c.nextDue
		if len(c.orphans) > 0 {
			wake = time.Now()
		}
		c.mu.Unlock()
		if wake.IsZero() {
			wake = time.Now().Add(time.Hour)
		}
		if wake.Before(retryAt) {
			wake = retryAt
		}
		timer.Reset(time.Until(wake))
		select {
		case <-c.shutdown.Done():
			return
		case <-c.kick:
			continue
		case <-timer.C:
		}
		if c.hooks.noKeepalive {
			c.mu.Lock()
			c.nextDue = time.Time{}
			c.mu.Unlock()
			continue
		}
		again := c.tick()
		if again {
			retryAt = time.Now().Add(jitter(retry))
			retry = min(retry*2, retryMax)
		} else {
			retryAt = time.Time{}
			retry = retryMin
		}
	}
}

// tick renews the due leases and expires orphaned grants. It reports whether
// something must be retried soon.
func (c *Client) tick() (again bool) {
	now := time.Now()
	c.mu.Lock()
	orphans := c.orphans
	c.orphans = nil
	due := c.due[:0] // reused: a tick of 10,000 leases would grow a new one each time
	var minTTL time.Duration
	for _, l := range c.held {
		if l.nextRenew.After(now.Add(l.ttl / 12)) {
			continue
		}
		if !l.renewMu.TryLock() {
			again = true // Renew or Extend is renewing it: look again shortly
			continue
		}
		due = append(due, renewal{l, l.ttl})
		if minTTL == 0 || l.ttl < minTTL {
			minTTL = l.ttl
		}
	}
	c.mu.Unlock()
	defer func() {
		for _, r := range due {
			r.l.renewMu.Unlock()
		}
		clear(due) // keep no lease reachable from the buffer
		c.due = due[:0]
	}()

	if len(orphans) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.releaseTimeout)
		if err := c.releaseBatch(ctx, "end grants of lost leases", orphans); err != nil {
			c.log.Warn("leases: end grants of lost leases", "count", len(orphans), "err", err)
		}
		cancel()
	}
	if len(due) > 0 {
		// Bounded so that a silent network cannot stall the next tick past
		// the earliest deadline; those deadlines fire on their own anyway.
		ctx, cancel := context.WithTimeout(context.Background(), minTTL/3)
		again = c.renewBatch(ctx, due, lostRenewRejected) || again
		cancel()
	}

	c.mu.Lock()
	c.nextDue = time.Time{}
	for _, l := range c.held {
		if c.nextDue.IsZero() || l.nextRenew.Before(c.nextDue) {
			c.nextDue = l.nextRenew
		}
	}
	c.mu.Unlock()
	return again
}

// renewal is a lease due for renewal, with the TTL it is renewed for. The
// keepalive holds the lease's renewMu while the renewal is in flight.
type renewal struct {
	l   *Lease
	ttl time.Duration
}

// renewBatch renews rs in one statement. Leases the statement reports
// gone are lost at once, for the reason why the renewal ran (a scheduled
// one: lostRenewRejected); busy ones, and all of them on an error, stay
// due.
func (c *Client) renewBatch(ctx context.Context, rs []renewal, why lostCause) (again bool) {
	names := make([]string, len(rs))
	owners := make([]string, len(rs))
	fences := make([]int64, len(rs))
	ttls := make([]int64, len(rs))
	for i, r := range rs {
		l := r.l
		names[i], owners[i], fences[i], ttls[i] = l.name, l.owner, l.fence, r.ttl.Microseconds()
	}
	reqStart := time.Now()
	failed := func(err error) bool {
		for _, r := range rs {
			c.m.recordRenewal(r.l.name, renewError)
		}
		c.log.Warn("leases: renew failed; retrying until the local deadline", "leases", len(rs), "err", err)
		return true
	}
	var spanName string
	var spanFence int64
	if len(rs) == 1 {
		spanName, spanFence = rs[0].l.name, rs[0].l.fence
	}
	ctx, span := c.tr.Start(ctx, spanRenew, spanName, spanFence)
	var err error
	defer func() { span.End(0, err) }()
	rows, err := c.q.Query(ctx, sqlRenewBatch, names, owners, fences, ttls)
	if err != nil {
		return failed(err)
	}
	type result struct {
		l         *Lease
		expiresAt *time.Time
		busy      bool
		handover  bool
	}
	results := make([]result, 0, len(rs))
	m := rowMatcher{rs: rs}
	for rows.Next() {
		var name string
		var r result
		if err := rows.Scan(&name, &r.expiresAt, &r.busy, &r.handover); err != nil {
			rows.Close()
			return failed(err)
		}
		r.l = m.lease(len(results), name)
		results = append(results, r)
	}
	if err := rows.Err(); err != nil {
		return failed(dbError("renew", err))
	}
	var lost []*Lease
	c.mu.Lock()
	for _, r := range results {
		switch {
		case r.l == nil:
		case r.expiresAt != nil:
			c.m.recordRenewal(r.l.name, renewRenewed)
			c.renewedLocked(r.l, reqStart, *r.expiresAt)
			if r.handover {
				c.handoverLocked(r.l)
			}
		case r.busy:
			c.m.recordRenewal(r.l.name, renewBusy)
			again = true
		default:
			c.m.recordRenewal(r.l.name, renewLost)
			lost = append(lost, r.l)
		}
	}
	c.mu.Unlock()
	for _, l := range lost {
		c.lose(l, why, fmt.Errorf("renew %q: grant (fence %d) expired, force-released or taken over: %w", l.name, l.fence, ErrLost), false)
	}
	return again
}

// rowMatcher finds the lease a row of a batched statement reports on, by
// name. The rows usually come one per input and in its order, so row i is
// tried against rs[i] first, and a map by name is built only for rows that
// come otherwise.
type rowMatcher struct {
	rs     []renewal
	byName map[string]*Lease
}

// lease returns the lease of rs named name, reported by row i; nil if none.
func (m *rowMatcher) lease(i int, name string) *Lease {
	if i < len(m.rs) && m.rs[i].l.name == name {
		return m.rs[i].l
	}
	if m.byName == nil {
		m.byName = make(map[string]*Lease, len(m.rs))
		for _, r := range m.rs {
			m.byName[r.l.name] = r.l
		}
	}
	return m.byName[name]
}

// recheckLocked has the named lease renewed now, if this client holds
// it: a release notification for it means someone released or
// force-released the name or asked for a hand-over, and the holder should
// learn at once rather than at its next scheduled renewal. c.mu held.
func (c *Client) recheckLocked(name string) {
	l := c.held[name]
	if l == nil || c.isClosed() {
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		l.renewMu.Lock()
		defer l.renewMu.Unlock()
		c.recheck(l, lostForceReleased)
	}()
}

// recheck renews l at once, outside the keepalive's schedule, because of
// a force-release: a grant the renewal finds gone was lost for reason why.
// If the renewal must be retried (busy, or failed), the keepalive does it
// next. l.renewMu held.
func (c *Client) recheck(l *Lease, why lostCause) {
	c.mu.Lock()
	held := l.state == stateHeld
	ttl := l.ttl
	c.mu.Unlock()
	if !held {
		return
	}
	ctx, cancel := context.WithTimeout(c.shutdown, ttl/3)
	defer cancel()
	if c.renewBatch(ctx, []renewal{{l, ttl}}, why) {
		c.mu.Lock()
		if c.held[l.name] == l {
			l.nextRenew = time.Now()
			c.nextDue = l.nextRenew
			c.kickKeepalive()
		}
		c.mu.Unlock()
	}
}
