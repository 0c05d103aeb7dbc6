package pglock

import (
	"context"
	"errors"
	"net"
	"strconv"
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
			ocfg := observer.Config().ConnConfig
			px := startProxy(t, net.JoinHostPort(ocfg.Host, strconv.Itoa(int(ocfg.Port))))
			l := newLocker(t, pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = "127.0.0.1", px.Port(), nil
				cfg.MaxConns = calls + 3
			}))
			ctx := testContext(t)
			holder, err := l.Lock(ctx, "abandoned")
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Unlock(ctx)

			var wg sync.WaitGroup
			var mu sync.Mutex
			var overrun time.Duration // the longest a Lock returned after its context ended
			errs := make(chan error, calls)
			for range calls {
				wg.Go(func() {
					var wctx context.Context
					var cancel context.CancelFunc
					ended := time.Now().Add(1500 * time.Millisecond)
					if how == "deadline" {
						wctx, cancel = context.WithDeadline(ctx, ended)
					} else {
						wctx, cancel = context.WithCancel(ctx)
					}
					defer cancel()
					if how == "cancel" {
						time.AfterFunc(1500*time.Millisecond, cancel)
					}
					lk, err := l.Lock(wctx, "abandoned")
					returned := time.Now()
					<-wctx.Done()
					mu.Lock()
					overrun = max(overrun, returned.Sub(ended))
					mu.Unlock()
					if err == nil {
						lk.Unlock(ctx)
						err = errors.New("granted while held")
					}
					errs <- err
				})
			}
			pgtest.WaitFor(t, 10*time.Second, "the waiters to queue", func() bool { return waiters(t, observer) == calls })
			// The pool keeps two idle connections from before, as a pool
			// in use does: pglock's fallback cancels through one of them.
			var spare []*pgxpool.Conn
			for range 2 {
				c, err := l.pool.Acquire(ctx)
				if err != nil {
					t.Fatal(err)
				}
				spare = append(spare, c)
			}
			for _, c := range spare {
				c.Release()
			}
			px.RefuseNew()
			wg.Wait()
			close(errs)
			want := context.DeadlineExceeded
			if how == "cancel" {
				want = context.Canceled
			}
			for err := range errs {
				if !errors.Is(err, want) {
					t.Errorf("abandoned Lock = %v, want %v", err, want)
				}
			}
			start := time.Now()
			pgtest.WaitFor(t, time.Second, "no backend waiting for the lock", func() bool { return waiters(t, observer) == 0 })
			t.Logf("no waiter left %v after the last Lock returned; Lock returned at most %v after its context ended", time.Since(start), overrun)
		})
	}
}
