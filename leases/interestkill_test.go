package leases

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A waiter wakes within about a round trip of a release even after its
// client's interest connection — the one holding the wait keys, which
// nothing reads — lost its backend (an operator's pg_terminate_backend,
// idle_session_timeout): the listener notices and starts again with a
// new pair of connections. Before, nobody noticed: the keys were gone, so
// releases did not notify, and the waiter slept until its poll or the
// holder's expiry (a minute here). The bound of 10s is the check's
// period (1s), the listener's restart (backoff, LISTEN and its probe) and
// room for a loaded machine; the poll interval and the TTL are a minute.
func TestWaiterWakesAfterInterestBackendKilled(t *testing.T) {
	t.Parallel()
	cs, pools := clients(t, 2, WithPollInterval(time.Minute))
	holder, waiter := cs[0], cs[1]
	ctx := testContext(t)
	l, err := holder.TryAcquire(ctx, "handoff", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan taken, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "handoff", time.Minute)
		done <- taken{l, err}
	}()
	waitListening(t, waiter)
	// The backend that holds the waiter's wait key (shared, class
	// 1885824613), once the listener has taken it.
	var pid int32
	pgtest.WaitFor(t, testTimeout, "the wait key to be held", func() bool {
		err := pools[0].QueryRow(ctx, `SELECT coalesce(min(pid), 0) FROM pg_locks
  WHERE locktype = 'advisory' AND classid = 1885824613 AND objid = ($1::int4)::bigint & 4294967295
    AND mode = 'ShareLock' AND granted`, waitKey("handoff")).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid != 0
	})
	if _, err := pools[0].Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		if err := r.l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	case <-wctx.Done():
		t.Fatalf("the waiter did not get the lease within %v of its release after its interest backend was terminated", time.Since(start).Round(time.Millisecond))
	}
}
