package leases

import (
	"container/heap"
	"math/bits"
	"time"
)

// Local deadlines. Every held lease has one: the start of the request of
// its last successful grant or renewal + TTL − margin; if it passes before
// a renewal succeeds, the lease is lost (deadlineLoss). The Client keeps its
// held leases in a min-heap by deadline and runs one timer, for the
// earliest, or for a second from now if that is sooner (wallCheck).
// Grants, renewals and releases change the heap, not the timer: it is
// re-armed only for a time earlier than the one it is set for, and is
// left set when that lease goes (it then fires once for nothing).
// So a lease taken and released in a loop arms no timer per cycle — each
// new earliest runtime timer may wake a thread of the Go scheduler, which
// cost 3–5 % of a TryAcquire + Release cycle on loopback — and a renewal of
// 10,000 leases moves 10,000 heap entries instead of 10,000 timers (and
// sorts the heap once, batchLocked, rather than fixing each entry).
type deadlines struct {
	h     deadlineHeap
	timer *time.Timer // runs onDeadlines; nil until the first lease
	armed time.Time   // when timer fires; zero: not set
	batch bool        // setDeadlineLocked leaves the order to endBatchLocked
}

// deadlineHeap orders leases by deadline. Each entry holds its lease's
// deadline, so that ordering reads no Lease; Lease.dlPos is 1 + a lease's
// index in it, 0 when it is not in it. c.mu guards both.
type deadlineHeap []dlEntry

type dlEntry struct {
	at time.Time // l.deadline
	l  *Lease
}

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].l.dlPos, h[j].l.dlPos = i+1, j+1
}

// Push adds a *Lease, at its deadline.
func (h *deadlineHeap) Push(x any) {
	l := x.(*Lease)
	*h = append(*h, dlEntry{l.deadline, l})
	l.dlPos = len(*h)
}

// Pop removes the last entry and returns its *Lease.
func (h *deadlineHeap) Pop() any {
	old := *h
	l := old[len(old)-1].l
	old[len(old)-1] = dlEntry{}
	*h = old[:len(old)-1]
	l.dlPos = 0
	return l
}

// fix restores the order after l's deadline changed.
func (h *deadlineHeap) fix(l *Lease) {
	(*h)[l.dlPos-1].at = l.deadline
	heap.Fix(h, l.dlPos-1)
}

// setDeadlineLocked sets l's local deadline to d, and watches it. c.mu held.
func (c *Client) setDeadlineLocked(l *Lease, d time.Time) {
	l.deadline = d
	switch {
	case l.dlPos == 0:
		heap.Push(&c.dl.h, l)
	case c.dl.batch:
		c.dl.h[l.dlPos-1].at = d
	default:
		c.dl.h.fix(l)
	}
	c.armLocked(d)
}

// batchLocked says that about n deadlines are about to move together (a
// batched renewal). If sorting the whole heap again is cheaper than fixing
// n entries, setDeadlineLocked leaves the order to endBatchLocked, which
// must be called before c.mu is released. c.mu held.
func (c *Client) batchLocked(n int) {
	c.dl.batch = n*bits.Len(uint(len(c.dl.h))) > 2*len(c.dl.h)
}

// endBatchLocked ends batchLocked: the heap is in order again. c.mu held.
func (c *Client) endBatchLocked() {
	if c.dl.batch {
		c.dl.batch = false
		heap.Init(&c.dl.h)
	}
}

// unwatchLocked stops watching l's deadline. c.mu held.
func (c *Client) unwatchLocked(l *Lease) {
	if l.dlPos != 0 {
		heap.Remove(&c.dl.h, l.dlPos-1)
	}
}

// wallCheck is how often the timer fires while leases are held, however
// far their deadlines are, so that onDeadlines checks them by the wall
// clock too.
const wallCheck = time.Second

// armLocked makes the timer fire no later than d, nor than wallCheck from
// now. c.mu held.
func (c *Client) armLocked(d time.Time) {
	if check := time.Now().Add(wallCheck); check.Before(d) {
		d = check
	}
	if !c.dl.armed.IsZero() && !d.Before(c.dl.armed) {
		return
	}
	c.dl.armed = d
	if c.dl.timer == nil {
		c.dl.timer = time.AfterFunc(time.Until(d), c.onDeadlines)
		return
	}
	c.dl.timer.Reset(time.Until(d))
}

// stopDeadlinesLocked stops the timer, for Close. c.mu held.
func (c *Client) stopDeadlinesLocked() {
	if c.dl.timer != nil {
		c.dl.timer.Stop()
	}
	c.dl.armed = time.Time{}
}

// onDeadlines runs when the timer fires: it takes the leases whose
// deadline has passed off the heap, re-arms the timer for the next one,
// and loses them. It counts in c.wg, so that Close waits for it; once
// Close has begun it does nothing (Close ends every lease).
//
// A deadline has passed when either clock says so. The monotonic clock,
// which the heap orders by, stops while the system is suspended on Linux
// (golang/go#24595), so a process that wakes after its leases expired
// would trust them until the monotonic clock caught up; the wall clock
// goes on, so every held lease is checked by it too. A wall clock stepped
// forward past a deadline loses that lease early: the safe direction.
func (c *Client) onDeadlines() {
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	defer c.wg.Done()
	c.dl.armed = time.Time{}
	now := time.Now()
	var due []*Lease
	for _, e := range c.dl.h {
		if c.passedLocked(now, e.at) {
			due = append(due, e.l)
		}
	}
	for _, l := range due {
		heap.Remove(&c.dl.h, l.dlPos-1)
	}
	if len(c.dl.h) > 0 {
		c.armLocked(c.dl.h[0].at)
	}
	c.mu.Unlock()
	lost := make([]loss, 0, len(due))
	for _, l := range due {
		if x, ok := c.deadlineLoss(l); ok {
			lost = append(lost, x)
		}
	}
	c.loseAll(lost, true)
}

// passedLocked reports whether deadline d has passed at now by either
// clock: the monotonic one, or the wall clock (see onDeadlines). c.mu held.
func (c *Client) passedLocked(now, d time.Time) bool {
	return !now.Before(d) || !c.wallLocked(now).Before(d.Round(0))
}

// wallLocked is now's wall clock reading, without its monotonic one
// (moved by hooks.wallSkew in tests). c.mu held.
func (c *Client) wallLocked(now time.Time) time.Time {
	return now.Round(0).Add(c.hooks.wallSkew)
}
