package leases

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgfence/pgfence/internal/dbx"
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
// releases the grant). A lease of the same name this client still held is
// lost: the new grant proves its grant over (force-released, and granted
// again before its holder's next renewal learned of it), and left in
// place it would be renewed no more, nor ended by Close.
func (c *Client) register(l *Lease, start time.Time) error {
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		return ErrClosed
	}
	old := c.held[l.name]
	c.setDeadlineLocked(l, start.Add(l.ttl-margin(l.ttl)))
	l.nextRenew = start.Add(l.ttl / 3)
	c.held[l.name] = l
	if c.nextDue.IsZero() || l.nextRenew.Before(c.nextDue) {
		c.nextDue = l.nextRenew
		c.kickKeepalive()
	}
	c.mu.Unlock()
	if old != nil && old != l {
		c.lose(old, lostForceReleased, fmt.Errorf("leases: lease %q (fence %d): granted again (fence %d), so its grant is over: %w",
			old.name, old.fence, l.fence, ErrLost), false)
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
	c.loseAll([]loss{{l, why, cause}}, orphan)
}

// A loss is a lease to lose, why and with what cause, as lose says.
type loss struct {
	l     *Lease
	why   lostCause
	cause error
}

// loseAll is lose for several leases found lost together. Every one is
// lost, its Context ended and its local waiters woken before anything is
// logged: the log handler is the application's, and one that stalls (a
// full pipe, a slow shipper) must not keep a lease that is no longer safely
// held looking held. Those no longer held are skipped.
func (c *Client) loseAll(ls []loss, orphan bool) {
	if len(ls) == 0 {
		return
	}
	c.mu.Lock()
	end := time.Now()
	n := 0
	for _, x := range ls {
		l := x.l
		if l.state != stateHeld {
			continue
		}
		l.state = stateLost
		c.dropLocked(l)
		// Recorded before the context ends, so that whoever sees it done
		// sees them.
		c.m.recordHold(l, true, end)
		c.m.recordLost(l.name, x.why)
		l.endLocked(x.cause)
		if orphan {
			c.orphanLocked(l)
		}
		ls[n] = x
		n++
	}
	c.mu.Unlock()
	ls = ls[:n]
	for _, x := range ls {
		c.wakeQueue(x.l.queue())
	}
	for _, x := range ls {
		l := x.l
		c.log.Warn("leases: lease lost", "name", l.name, "owner", l.owner, "fence", l.fence,
			"cause", lostCauseNames[x.why], "held", end.Sub(l.since), "err", x.cause)
	}
}

// orphanLocked hands l's grant, which may still be ours though l is no
// longer held, to the keepalive to end (endOrphans), and to Close if Close
// comes first; not once Close has begun (it ends what it holds itself),
// nor for a frozen holder (hooks.noKeepalive). c.mu held.
func (c *Client) orphanLocked(l *Lease) {
	if c.hooks.noKeepalive || c.isClosed() {
		return
	}
	c.orphans = append(c.orphans, l)
	c.kickKeepalive()
}

// deadlineLoss is the loss of l, taken off the deadline heap by
// onDeadlines, or false if it is gone or its deadline has moved since
// (whatever moves it, setDeadlineLocked, put it back on the heap).
func (c *Client) deadlineLoss(l *Lease) (loss, bool) {
	c.mu.Lock()
	now := time.Now()
	stale := l.state != stateHeld || !c.passedLocked(now, l.deadline)
	why := "no successful renewal before the local deadline"
	if now.Before(l.deadline) {
		why = "the local deadline passed by the wall clock (was the system suspended?)"
	}
	ttl := l.ttl
	c.mu.Unlock()
	if stale {
		return loss{}, false
	}
	return loss{l, lostDeadline, fmt.Errorf("leases: lease %q (fence %d): %s (TTL %s − margin %s): %w",
		l.name, l.fence, why, ttl, margin(ttl), ErrLost)}, true
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
	var buf renewBuf
	for {
		c.mu.Lock()
		wake := c.nextDue
		if c.orphansToEndLocked() {
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
		again := c.tick(&buf)
		if again {
			retryAt = time.Now().Add(jitter(retry))
			retry = min(retry*2, retryMax)
		} else {
			retryAt = time.Time{}
			retry = retryMin
		}
	}
}

// tick renews the due leases, with buf's slices, and starts ending
// orphaned grants. It reports whether something must be retried soon.
func (c *Client) tick(buf *renewBuf) (again bool) {
	now := time.Now()
	c.mu.Lock()
	if c.orphansToEndLocked() {
		c.ending = true
		c.wg.Add(1) // the keepalive's own count is held: Close is not past Wait
		go c.endOrphans(c.orphans)
		c.orphans = nil
	}
	due := buf.due[:0] // reused: a tick of 10,000 leases would grow a new one each time
	var minTTL time.Duration
	var earliest time.Time // the earliest local deadline among them
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
		if earliest.IsZero() || l.deadline.Before(earliest) {
			earliest = l.deadline
		}
	}
	c.mu.Unlock()
	defer func() {
		for _, r := range due {
			r.l.renewMu.Unlock()
		}
		clear(due) // keep no lease reachable from the buffer
		buf.due = due[:0]
	}()

	if len(due) > 0 {
		// Under the shutdown: Close does not wait for a renewal that the
		// server does not answer (it ends every lease anyway).
		ctx, cancel := context.WithTimeout(c.shutdown, buf.timeout(len(due), minTTL, earliest.Sub(now)))
		again = c.renewBatchBuf(ctx, due, lostRenewRejected, buf) || again
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

// orphansToEndLocked reports whether the keepalive should start
// endOrphans now: grants wait to be ended, none is being ended, and Close
// (which ends them itself) has not begun. c.mu held.
func (c *Client) orphansToEndLocked() bool {
	return len(c.orphans) > 0 && !c.ending && !c.isClosed()
}

// endOrphans ends the grants of leases lost at their local deadline, and
// of leases whose Release failed (endLater), so that waiters need not wait
// for the server's expiry. It runs off the
// keepalive's goroutine: the statement may wait for a row lock (a fenced
// REPEATABLE READ transaction share-locks its lease's row) up to the
// release timeout, and the other leases' renewals must not wait with it.
// One runs at a time; Close cuts it short and ends the grants itself.
func (c *Client) endOrphans(ls []*Lease) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.shutdown, c.cfg.releaseTimeout)
	failed, err := c.releaseBatch(ctx, "end grants of lost leases and failed releases", ls)
	cancel()
	c.mu.Lock()
	c.ending = false
	closed := c.isClosed()
	if err != nil && closed {
		c.orphans = append(c.orphans, failed...) // for Close
	} else if len(c.orphans) > 0 {
		c.kickKeepalive()
	}
	c.mu.Unlock()
	if err != nil && !closed {
		c.log.Warn("leases: end grants of lost leases and failed releases", "count", len(ls), "err", err)
	}
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
	return c.renewBatchBuf(ctx, rs, why, new(renewBuf))
}

// renewBuf holds tick's due renewals and renewBatch's arrays, so that the
// keepalive reuses them from tick to tick instead of allocating them for
// every lease each time, and the time a renewal has taken per lease. Only
// the keepalive goroutine uses its renewBuf.
type renewBuf struct {
	due           []renewal
	names, owners []string
	fences, ttls  []int64
	results       []renewResult
	wire          []byte        // the arrays encoded (renewwire.go)
	perLease      time.Duration // slowest recent successful batch, per lease; decays
}

// batchFloor is the fewest leases a batch counts as when its time is
// turned into a rate: a small batch's time is mostly its round trip, which
// a large batch pays once, not per lease.
const batchFloor = 100

// took records that a batch of n renewals succeeded in d.
func (b *renewBuf) took(n int, d time.Duration) {
	if n == 0 {
		return
	}
	b.perLease = max(d/time.Duration(max(n, batchFloor)), b.perLease-b.perLease/8)
}

// timeout bounds one batched renewal of n leases, left before the earliest
// of their local deadlines. It is at least minTTL/3, their shortest TTL's,
// so that a silent connection (a dead server, a partition) leaves time to
// retry on another before the deadlines. It is longer when recent batches
// were slow — three times what n leases took at the slowest recent rate,
// up to the earliest deadline — so that a statement that is slow but
// succeeding is not cancelled at every attempt until its leases are lost.
func (b *renewBuf) timeout(n int, minTTL, left time.Duration) time.Duration {
	return max(minTTL/3, min(3*time.Duration(max(n, batchFloor))*b.perLease, left))
}

// renewResult is a row of a batched renewal.
type renewResult struct {
	i         int                // the renewal it reports on; -1: none
	expiresAt pgtype.Timestamptz // not Valid: not renewed
	busy      bool
	handover  bool
}

// reset empties b's arrays for the next batch, clearing them first: they
// keep no lease's name or owner reachable.
func (b *renewBuf) reset() {
	clear(b.names)
	clear(b.owners)
	clear(b.results)
	b.names, b.owners, b.fences, b.ttls, b.results = b.names[:0], b.owners[:0], b.fences[:0], b.ttls[:0], b.results[:0]
}

// args are the batched renewal's arguments, the arrays of b.
func (b *renewBuf) args() []any {
	return []any{textArray(b.names), textArray(b.owners), int8Array(b.fences), int8Array(b.ttls)}
}

// renewBatchBuf is renewBatch with buf's arrays, which it empties when
// done (reset).
func (c *Client) renewBatchBuf(ctx context.Context, rs []renewal, why lostCause, buf *renewBuf) (again bool) {
	n := len(rs)
	buf.names = slices.Grow(buf.names[:0], n)[:n]
	buf.owners = slices.Grow(buf.owners[:0], n)[:n]
	buf.fences = slices.Grow(buf.fences[:0], n)[:n]
	buf.ttls = slices.Grow(buf.ttls[:0], n)[:n]
	buf.results = slices.Grow(buf.results[:0], n)
	defer buf.reset()
	names := buf.names
	for i, r := range rs {
		l := r.l
		names[i], buf.owners[i], buf.fences[i], buf.ttls[i] = l.name, l.owner, l.fence, r.ttl.Microseconds()
	}
	reqStart := time.Now()
	failed := func(err error) bool {
		if c.isClosed() {
			return false // cut short by Close, which ends the leases
		}
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
	err = c.serially(ctx, func() error {
		buf.results = buf.results[:0]
		return c.renewRows(ctx, buf)
	})
	if err != nil {
		return failed(err)
	}
	results := buf.results
	for _, r := range results {
		if r.expiresAt.Valid && r.expiresAt.InfinityModifier != pgtype.Finite {
			err = errors.New("cannot scan an infinite expires_at into time.Time")
			return failed(err)
		}
	}
	buf.took(n, time.Since(reqStart))
	var lost, asked []*Lease
	c.mu.Lock()
	c.batchLocked(len(results))
	for _, r := range results {
		if r.i < 0 {
			continue
		}
		// names[r.i] is l.name: reading it spares a cache miss on l.
		l, name := rs[r.i].l, names[r.i]
		switch {
		case r.expiresAt.Valid:
			c.m.recordRenewal(name, renewRenewed)
			c.renewedLocked(l, reqStart, r.expiresAt.Time)
			if r.handover && c.handoverLocked(l) {
				asked = append(asked, l)
			}
		case r.busy:
			c.m.recordRenewal(name, renewBusy)
			again = true
		default:
			if l.state == stateHeld { // else its Release ended the grant, and accounts for it
				c.m.recordRenewal(name, renewLost)
			}
			lost = append(lost, l)
		}
	}
	c.endBatchLocked()
	c.mu.Unlock()
	losses := make([]loss, len(lost))
	for i, l := range lost {
		losses[i] = loss{l, why, l.goneErr("renew")}
	}
	c.loseAll(losses, false) // first: the logs below must not delay a loss
	for _, l := range asked {
		c.steppingDown(l)
	}
	return again
}

// rowMatcher finds the input a row of a batched statement reports on, by
// name. The rows usually come one per input and in its order, so row i is
// tried against input i first, and a map by name is built only for rows
// that come otherwise.
type rowMatcher struct {
	names  []string // the inputs' names
	byName map[string]int
}

// index returns the index of the input named name, reported by row i; -1
// if none.
func (m *rowMatcher) index(i int, name []byte) int {
	if i < len(m.names) && m.names[i] == string(name) {
		return i
	}
	if m.byName == nil {
		m.byName = make(map[string]int, len(m.names))
		for j, n := range m.names {
			m.byName[n] = j
		}
	}
	if j, ok := m.byName[string(name)]; ok {
		return j
	}
	return -1
}

// textArray and int8Array are text[] and bigint[] arguments. pgx, when it
// knows the parameter's type, encodes them without boxing each element in
// an interface (an allocation per element, as for a []string): Index
// returns a pointer into the slice. Otherwise (pgx's exec and
// simple_protocol modes, database/sql) they are array literals.
type (
	textArray []string
	int8Array []int64
	textElem  string
	int8Elem  int64
)

func (a textArray) Dimensions() []pgtype.ArrayDimension { return dims(len(a)) }
func (a textArray) Index(i int) any                     { return (*textElem)(&a[i]) }
func (a textArray) IndexType() any                      { return new(textElem) }
func (a textArray) Value() (driver.Value, error)        { return dbx.Args([]any{[]string(a)})[0], nil }
func (a int8Array) Dimensions() []pgtype.ArrayDimension { return dims(len(a)) }
func (a int8Array) Index(i int) any                     { return (*int8Elem)(&a[i]) }
func (a int8Array) IndexType() any                      { return new(int8Elem) }
func (a int8Array) Value() (driver.Value, error)        { return dbx.Args([]any{[]int64(a)})[0], nil }

func (e *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*e), Valid: true}, nil
}
func (e *int8Elem) Int64Value() (pgtype.Int8, error) {
	return pgtype.Int8{Int64: int64(*e), Valid: true}, nil
}

func dims(n int) []pgtype.ArrayDimension {
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}

// rowName is a lease name column, scanned without allocating per row: pgx
// lends it the row's bytes (valid until the next row), database/sql copies
// into it. NULL is an error, as it is for a string.
type rowName []byte

// ScanBytes implements pgtype.BytesScanner.
func (n *rowName) ScanBytes(b []byte) error {
	if b == nil {
		return errors.New("cannot scan NULL into a lease name")
	}
	*n = b
	return nil
}

// Scan implements sql.Scanner.
func (n *rowName) Scan(src any) error {
	switch src := src.(type) {
	case string:
		*n = append((*n)[:0], src...)
	case []byte:
		*n = append((*n)[:0], src...)
	default:
		return fmt.Errorf("cannot scan %T into a lease name", src)
	}
	return nil
}

// recheckLocked has the named lease renewed now, if this client holds
// it: a release notification for it means someone released or
// force-released the name or asked for a hand-over, and the holder should
// learn at once rather than at its next scheduled renewal. c.mu held.
//
// Any role that can connect may NOTIFY, so notifications are not trusted
// to say anything (the renewal finds out) nor to come at a bearable rate:
// while one recheck of l waits to begin, later notifications join it
// instead of starting their own. Each notification is still followed by a
// renewal that begins after it.
func (c *Client) recheckLocked(name string) {
	l := c.held[name]
	if l == nil || c.isClosed() || l.rechecking {
		return
	}
	l.rechecking = true
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		l.renewMu.Lock()
		defer l.renewMu.Unlock()
		c.mu.Lock()
		l.rechecking = false
		c.mu.Unlock()
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
