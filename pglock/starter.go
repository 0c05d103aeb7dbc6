package pglock

import (
	"sync"
	"time"
)

// The start of session monitors. A Lock's monitor (monitor.go) starts a
// short delay after the grant, so that a lock held briefly (most are)
// starts no goroutine. The delay is the same for every Lock of a Locker,
// so Locks come due in the order they were granted: the Locker queues them
// and runs one timer, for the head of the queue. A grant appends to the
// queue and arms the timer only if it is not set; an Unlock before the
// start leaves its Lock queued, marked, and the timer skips it. So locks
// taken and released in a loop fire the timer once per delay, not once
// per lock: a timer that becomes the earliest, and each firing's
// goroutine, can make the Go scheduler wake a thread, which costs a short
// lock cycle a few percent on loopback.
type starter struct {
	mu    sync.Mutex
	queue []*Lock // in grant order; an unlocked Lock stays until the timer passes it
	timer *time.Timer
	armed bool
	arms  int // times schedule armed the timer, for tests
	fires int // times the timer fired, for tests
}

// Lock.monitorState values. Exactly one CompareAndSwap from
// monitorPending wins: the starter's (the monitor runs and owns the
// connection until it closes done) or stopMonitor's (it never runs).
const (
	monitorPending int32 = iota
	monitorStarted
	monitorCancelled
)

// monitorDelay is how long after a grant a Lock's monitor starts.
func (l *Locker) monitorDelay() time.Duration {
	return min(l.hooks.monitorDelay, l.cfg.interval)
}

// schedule queues lk's monitor to start the delay after its grant.
func (l *Locker) schedule(lk *Lock) {
	d := l.monitorDelay()
	lk.due = lk.since.Add(d)
	s := &l.starter
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = append(s.queue, lk)
	if s.armed {
		return // the queue's head is due no later than lk
	}
	s.armed = true
	s.arms++
	if s.timer == nil {
		s.timer = time.AfterFunc(d, l.startDue)
		return
	}
	s.timer.Reset(d)
}

// startDue runs when the timer fires: it starts the monitors of the Locks
// due (unless Unlock came first), drops them and the unlocked Locks ahead
// of the first one still waiting from the queue, and re-arms the timer
// for that one. Re-arming for an unlocked Lock would make the timer fire
// once per Lock of a loop instead of once per delay.
func (l *Locker) startDue() {
	s := &l.starter
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fires++
	now := time.Now()
	n := 0
	for ; n < len(s.queue); n++ {
		lk := s.queue[n]
		if lk.monitorState.Load() == monitorCancelled {
			continue // unlocked before its start: it stays so
		}
		if now.Before(lk.due) {
			break
		}
		if lk.monitorState.CompareAndSwap(monitorPending, monitorStarted) {
			go lk.monitor()
		}
	}
	m := copy(s.queue, s.queue[n:])
	clear(s.queue[m:]) // let unlocked Locks go
	s.queue = s.queue[:m]
	if m == 0 {
		s.armed = false
		return
	}
	s.timer.Reset(s.queue[0].due.Sub(now))
}
