package leases

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/slogtest"
)

// A role or database may default to REPEATABLE READ or SERIALIZABLE
// (ALTER ROLE ... SET default_transaction_isolation). The Client's
// single-statement grants, renewals and releases, Once's record and
// ForceRelease then fail with serialization failures (40001) whenever
// replicas contend: before, Run and Semaphore.Run returned "could not
// serialize access due to concurrent update" and ForceRelease "read/write
// dependencies among transactions". The Client runs such a statement
// again: here replicas contend for an exclusive lease, a semaphore, a
// force-released lease and Once's periods under each level, over pgx and
// database/sql, and every call succeeds (or reports what its contract
// says). The Client logs its first retry, which proves the setting took
// effect and the contention produced the failures this test is about.
func TestNonDefaultIsolation(t *testing.T) {
	t.Parallel()
	base := pgtest.URL(t)
	for _, level := range []string{"repeatable read", "serializable"} {
		u := pgtest.WithSettings(base, "default_transaction_isolation="+strings.ReplaceAll(level, " ", `\ `))
		for _, driver := range []string{"pgx", "database/sql"} {
			t.Run(level+"/"+driver, func(t *testing.T) {
				t.Parallel()
				var logs slogtest.Buffer
				cs := make([]*Client, 3)
				for i := range cs {
					cs[i] = isolationClient(t, u, driver, level,
						WithPollInterval(100*time.Millisecond), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
				}
				prefix := strings.ReplaceAll(level, " ", "-") + "/" + driver + "/"
				testContention(t, cs, prefix)
				if !strings.Contains(logs.String(), "retrying a statement after a serialization failure") {
					t.Errorf("no statement was retried: the test did not contend under %s (logs:\n%s)", level, logs.String())
				}
			})
		}
	}
}

// isolationClient returns a Client over a pool of its own to databaseURL,
// checking that the session's isolation is level.
func isolationClient(t *testing.T, databaseURL, driver, level string, opts ...Option) *Client {
	t.Helper()
	ctx := testContext(t)
	var got string
	if driver == "pgx" {
		pool := pgtest.PoolFor(t, databaseURL)
		if err := pool.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != level {
			t.Fatalf("transaction_isolation = %q, want %q", got, level)
		}
		return newClient(t, pool, opts...)
	}
	db, err := sql.Open("pgx", databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	if err := db.QueryRowContext(ctx, `SHOW transaction_isolation`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != level {
		t.Fatalf("transaction_isolation = %q, want %q", got, level)
	}
	c, err := NewDB(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// testContention has cs contend, at once, for an exclusive lease, a
// semaphore, a lease being force-released and Once's periods.
func testContention(t *testing.T, cs []*Client, prefix string) {
	ctx := testContext(t)
	const goroutines, rounds = 9, 4
	var (
		wg                sync.WaitGroup
		inside, semInside atomic.Int32
		mu                sync.Mutex
		fences            []int64
		ran               = map[string]int{}
	)
	errorf := func(format string, args ...any) { t.Errorf(format, args...) }
	for i := range goroutines {
		c := cs[i%len(cs)]
		// An exclusive lease: never two holders, every Run granted.
		wg.Go(func() {
			for range rounds {
				err := c.Run(ctx, prefix+"exclusive", 5*time.Second, func(ctx context.Context, l *Lease) error {
					if n := inside.Add(1); n != 1 {
						errorf("%d holders of the exclusive lease at once", n)
					}
					mu.Lock()
					fences = append(fences, l.Fence())
					mu.Unlock()
					time.Sleep(time.Millisecond) // hold it a moment: widen any overlap
					inside.Add(-1)
					return nil
				})
				if err != nil {
					errorf("Run: %v", err)
					return
				}
			}
		})
		// A semaphore of 2 slots.
		wg.Go(func() {
			s, err := c.Semaphore(prefix+"semaphore", 2)
			if err != nil {
				errorf("Semaphore: %v", err)
				return
			}
			for range rounds {
				err := s.Run(ctx, 5*time.Second, func(ctx context.Context, l *Lease) error {
					if n := semInside.Add(1); n > 2 {
						errorf("%d holders of a semaphore of 2", n)
					}
					time.Sleep(time.Millisecond)
					semInside.Add(-1)
					return nil
				})
				if err != nil {
					errorf("Semaphore.Run: %v", err)
					return
				}
			}
		})
		// Once: each period runs once, whoever gets there first.
		wg.Go(func() {
			for p := range rounds {
				period := fmt.Sprintf("p%d", p)
				_, err := c.Once(ctx, prefix+"once", period, 5*time.Second, func(ctx context.Context, l *Lease) error {
					mu.Lock()
					ran[period]++
					mu.Unlock()
					return nil
				})
				if err != nil {
					errorf("Once %s: %v", period, err)
					return
				}
			}
		})
	}
	// A lease taken and released over and over while an operator
	// force-releases it: a release may find it gone (ErrLost), a
	// force-release may find it free (ErrNotHeld); nothing else.
	stop := make(chan struct{})
	var forced sync.WaitGroup
	forced.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			l, err := cs[0].TryAcquire(ctx, prefix+"forced", 5*time.Second)
			switch {
			case errors.Is(err, ErrHeld):
				continue
			case err != nil:
				errorf("TryAcquire of the force-released lease: %v", err)
				return
			}
			if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLost) {
				errorf("Release of the force-released lease: %v", err)
				return
			}
		}
	})
	forced.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := cs[1].ForceRelease(ctx, prefix+"forced"); err != nil && !errors.Is(err, ErrNotHeld) {
				errorf("ForceRelease: %v", err)
				return
			}
		}
	})
	wg.Wait()
	close(stop)
	forced.Wait()
	if len(fences) != goroutines*rounds {
		t.Errorf("%d grants of the exclusive lease, want %d", len(fences), goroutines*rounds)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Errorf("fence %d after %d: grants out of fence order", fences[i], fences[i-1])
		}
	}
	for p := range rounds {
		if n := ran[fmt.Sprintf("p%d", p)]; n != 1 {
			t.Errorf("Once ran period p%d %d times, want 1", p, n)
		}
	}
}
