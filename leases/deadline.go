package leases

import (
	"container/heap"
	"time"
)

// Local deadlines. Every held lease has one: the start of the request of
// its last successful grant or renewal + TTL − margin; if it passes before
// a renewal succeeds, the lease is lost (onDeadline). The Client keeps its
// held leases in a min-heap by deadline and runs one timer, for the
// earliest. Grants, renewals and releases change the heap, not the timer:
// it is re-armed only for a deadline earlier than the one it is set for,
// and is left set when that lease goes (it then fires once for nothing).
// So a lease taken and released in a loop arms no timer per cycle — each
// new earliest runtime timer may wake a thread of the Go scheduler, which
// cost 3–5 % of a TryAcquire + Release cycle on loopback — and a renewal of
// 10,000 leases moves 10,000 heap entries instead of 10,000 timers.
type deadlines struct {
	h     deadlineHeap
	timer *time.Timer // runs onDeadlines; nil until the first lease
	armed time.Time   // when timer fires; zero: not set
}

// deadlineHeap orders leases by deadline; Lease.dlPos is 1 + a lease's
// index in it, 0 when it is not in it. c.mu guards both.
type deadlineHeap []*Lease

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].dlPos, h[j].dlPos = i+1, j+1
}

func (h *deadlineHeap) Push(x any) {
	l := x.(*Lease)
	*h = append(*h, l)
	l.dlPos = len(*h)
}

func (h *deadlineHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.dlPos = 0
	return l
}

// setDeadlineLocked sets l's local deadline to d, and watches it. c.mu held.
func (c *Client) setDeadlineLocked(l *Lease, d time.Time) {
	l.deadline = d
	if l.dlPos == 0 {
		heap.Push(&c.dl.h, l)
	} else {
		heap.Fix(&c.dl.h, l.dlPos-1)
	}
	c.armLocked(d)
}

// unwatchLocked stops watching l's deadline. c.mu held.
func (c *Client) unwatchLocked(l *Lease) {
	if l.dlPos != 0 {
		heap.Remove(&c.dl.h, l.dlPos-1)
	}
}

// armLocked makes the timer fire no later than d. c.mu held.
func (c *Client) armLocked(d time.Time) {
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
// and loses them.
func (c *Client) onDeadlines() {
	c.mu.Lock()
	c.dl.armed = time.Time{}
	now := time.Now()
	var due []*Lease
	for len(c.dl.h) > 0 && !now.Before(c.dl.h[0].deadline) {
		due = append(due, heap.Pop(&c.dl.h).(*Lease))
	}
	if len(c.dl.h) > 0 && !c.isClosed() {
		c.armLocked(c.dl.h[0].deadline)
	}
	c.mu.Unlock()
	for _, l := range due {
		c.onDeadline(l)
	}
}
