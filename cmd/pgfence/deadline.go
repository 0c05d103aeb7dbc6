package main

import (
	"context"
	"syscall"
	"time"
	"unsafe"

	"github.com/pgfence/pgfence/leases"
)

// The timing rule of run --lease. pgfence trusts the lease until its local
// deadline, the rule of package leases (leases/doc.go, "The deadline rule"):
//
//	deadline = start of the last successful renewal + TTL − margin (TTL/10)
//
// which falls before the server can expire the lease, by at least the
// margin. The command must be gone by then, so the reaper (reaper.go) sends
// SIGTERM at deadline − grace and SIGKILL at the deadline. pgfence renews
// the lease itself, so that it knows when each successful renewal began,
// and pushes every new deadline to the reaper; the keepalive of package
// leases renews too, but its renewals are not visible through the API, so
// they never move the deadline here (which only makes it earlier, never
// later, than the library's own).
//
// pgfence renews every (TTL − margin − grace)/3, at most every TTL/3: two
// attempts can fail before SIGTERM is due. The grace may be at most TTL/2,
// so that renewals come at least every 2·TTL/15.

// leaseMargin is the leases package's safety margin: TTL/10, at least
// 100ms.
func leaseMargin(ttl time.Duration) time.Duration { return max(ttl/10, 100*time.Millisecond) }

// maxGrace is the longest --grace that fits a lease of ttl.
func maxGrace(ttl time.Duration) time.Duration { return ttl / 2 }

// renewEvery is how often run renews a lease of ttl with grace.
func renewEvery(ttl, grace time.Duration) time.Duration {
	return min(ttl/3, (ttl-leaseMargin(ttl)-grace)/3)
}

// clockMonotonic is CLOCK_MONOTONIC (linux/time.h).
const clockMonotonic = 1

// monoNow reads CLOCK_MONOTONIC in nanoseconds: one clock for every process
// on the machine, so pgfence can hand deadlines to the reaper as instants
// rather than as durations that would stretch by the time a message takes.
// (Go's own monotonic readings are per process.) It is the clock Go's
// timers and package leases run on.
func monoNow() int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic("clock_gettime(CLOCK_MONOTONIC): " + errno.Error()) // cannot fail on Linux
	}
	return ts.Nano()
}

// untilMono is the time from now to the CLOCK_MONOTONIC instant t.
func untilMono(t int64) time.Duration { return time.Duration(t - monoNow()) }

// renewer renews a lease for run and publishes each new local deadline.
type renewer struct {
	l         *leases.Lease
	every     time.Duration
	deadlines chan int64 // the latest deadline only (buffered 1)
	deadline  int64      // owned by the goroutine that renews
}

func newRenewer(l *leases.Lease, grace time.Duration) *renewer {
	return &renewer{l: l, every: renewEvery(l.TTL(), grace), deadlines: make(chan int64, 1)}
}

// renew renews once; on success it records and returns the new deadline.
// The attempt is bounded by the current deadline (a response after it is
// of no use), but gets at least one renewal period.
func (r *renewer) renew(ctx context.Context) error {
	start := monoNow()
	ctx, cancel := context.WithTimeout(ctx, max(untilMono(r.deadline), r.every))
	defer cancel()
	if err := r.l.Renew(ctx); err != nil {
		return err
	}
	r.deadline = max(r.deadline, start+int64(r.l.TTL()-leaseMargin(r.l.TTL())))
	return nil
}

// first establishes the first deadline before the command starts: the
// grant's own request start is not visible through the API. It retries
// until a renewal succeeds or the lease is lost.
func (r *renewer) first(ctx context.Context) (int64, error) {
	for backoff := retryMin; ; backoff = min(2*backoff, r.every) {
		err := r.renew(ctx)
		if err == nil {
			return r.deadline, nil
		}
		if lerr := r.l.Err(); lerr != nil {
			return 0, lerr
		}
		select {
		case <-ctx.Done():
			return 0, context.Cause(ctx)
		case <-r.l.Done():
		case <-time.After(backoff):
		}
	}
}

// retryMin is the first retry delay after a failed renewal.
const retryMin = 25 * time.Millisecond

// run renews every r.every (failures are retried with backoff from 25ms)
// and publishes each new deadline on r.deadlines, until ctx ends or the
// lease is no longer held. first must have succeeded.
func (r *renewer) run(ctx context.Context) {
	t := time.NewTimer(r.every)
	defer t.Stop()
	backoff := retryMin
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.l.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		if err := r.renew(ctx); err != nil {
			t.Reset(backoff)
			backoff = min(2*backoff, r.every)
			continue
		}
		backoff = retryMin
		select { // replace an unread deadline: only the latest counts
		case <-r.deadlines:
		default:
		}
		r.deadlines <- r.deadline
		t.Reset(r.every - time.Since(start))
	}
}
