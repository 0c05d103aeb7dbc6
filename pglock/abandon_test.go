package pglock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// waiters counts the backends of this database waiting for an advisory
// lock.
func waiters(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'
		   AND datname = current_database()`).Scan(&n)
	if err != nil {
		t.Fatalf("count advisory waiters: %v", err)
	}
	return n
}

// warm makes pool open n connections and keep them idle.
func warm(t testing.TB, pool *pgxpool.Pool, n int) {
	t.Helper()
	conns := make([]*pgxpool.Conn, 0, n)
	for range n {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			for _, c := range conns {
				c.Release()
			}
			t.Fatalf("open connection %d of %d: %v", len(conns)+1, n, err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
}

// An abandoned wait leaves no backend waiting: 20 Lock calls whose context
// ends (by deadline, or cancelled) while another session holds the lock
// return the context's error, and within a second of the last one
// returning pg_stat_activity shows none of them still waiting. Before the
// fix the client closed its socket and the server backend stayed queued
// behind the holder until the holder let go.
func TestAbandonedWaitLeavesNoWaiter(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"deadline", "cancel"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			const calls = 20
			url := pgtest.URL(t)
			observer := newPool(t, url, 2)
			// The waiters connect through a proxy that refuses new
			// connections once they wait: the cancel requests pgx sends
			// on a new connection are lost, as on a flaky network or
			// when the process exits first.
			px := proxyTo(t, observer)
			l := newLocker(t, pgtest.PoolFor(t, url, px.route, func(cfg *pgxpool.Config) { cfg.MaxConns = calls + 3 }))
			ctx := testContext(t)
			holder, err := l.Lock(ctx, "abandoned")
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Unlock(ctx)

			// Every waiter's connection exists before the waits' clock
			// starts: connecting 20 through the proxy to a container,
			// under -race on a loaded machine, once took longer than the
			// waits themselves, and a wait that ended before the others
			// had queued left the test waiting for 20 forever. Two stay
			// idle while the waiters wait, as in a pool in use: pglock's
			// fallback cancels through one of them.
			warm(t, l.pool, calls+2)

			// By deadline: each Lock's context has the same deadline, far
			// enough ahead for all of them to queue. Cancelled: the test
			// cancels them all once they have queued and the proxy
			// refuses new connections, so every cancel request is lost.
			deadline := time.Now().Add(3 * time.Second)
			abandon, cancelAll := context.WithCancel(ctx)
			defer cancelAll()
			type result struct {
				err      error
				returned time.Time
			}
			results := make(chan result, calls)
			var wg sync.WaitGroup
			for range calls {
				wg.Go(func() {
					wctx := abandon
					if how == "deadline" {
						var cancel context.CancelFunc
						wctx, cancel = context.WithDeadline(ctx, deadline)
						defer cancel()
					}
					lk, err := l.Lock(wctx, "abandoned")
					returned := time.Now()
					if err == nil {
						lk.Unlock(ctx)
						err = errors.New("granted while held")
					}
					results <- result{err, returned}
				})
			}
			queueFor := 10 * time.Second
			if how == "deadline" {
				queueFor = time.Until(deadline)
			}
			if !pgtest.Poll(queueFor, func() bool { return waiters(t, observer) == calls }) {
				queued := waiters(t, observer)
				cancelAll()
				wg.Wait()
				t.Fatalf("%d of %d waiters queued within %v", queued, calls, queueFor.Round(time.Millisecond))
			}
			px.RefuseNew()
			ended := deadline
			if how == "cancel" {
				ended = time.Now()
				cancelAll()
			}
			wg.Wait()
			close(results)
			want := context.DeadlineExceeded
			if how == "cancel" {
				want = context.Canceled
			}
			var overrun time.Duration // the longest a Lock returned after its context ended
			for r := range results {
				if !errors.Is(r.err, want) {
					t.Errorf("abandoned Lock = %v, want %v", r.err, want)
				}
				overrun = max(overrun, r.returned.Sub(ended))
			}
			start := time.Now()
			pgtest.WaitFor(t, time.Second, "no backend waiting for the lock", func() bool { return waiters(t, observer) == 0 })
			t.Logf("no waiter left %v after the last Lock returned; Lock returned at most %v after its context ended", time.Since(start), overrun)
		})
	}
}
