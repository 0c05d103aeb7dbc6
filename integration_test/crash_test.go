package integration_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// TestCrash SIGKILLs a holder process while this process waits for what it
// holds. It proves that a crashed holder leaks nothing for long: its
// advisory lock is released as soon as the kernel closes its socket, and its
// lease is granted to the waiter once the TTL has run out by the database
// clock, with a higher fence.
func TestCrash(t *testing.T) {
	t.Parallel()
	t.Run("AdvisoryLock", func(t *testing.T) {
		t.Parallel()
		u := setup(t)
		pool := newPool(t, u, "waiter")
		w := startWorker(t, workerConfig{Role: "lock", ID: "holder", URL: u, Name: "crash"})
		w.await("acquired", time.Minute)

		type result struct {
			lk  *pglock.Lock
			err error
			at  time.Time
		}
		res := make(chan result, 1)
		ctx := ctxT(t, time.Minute)
		locker := newLocker(t, pool)
		go func() {
			lk, err := locker.Lock(ctx, "crash")
			res <- result{lk, err, time.Now()}
		}()
		// Kill only once the waiter really waits in PostgreSQL.
		mustWait(t, 30*time.Second, "the waiter to queue on the lock", func() (bool, error) {
			var n int
			err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
			     WHERE locktype = 'advisory' AND NOT granted
			       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
			return n == 1, err
		})
		killed := time.Now()
		w.kill(syscall.SIGKILL)
		r := <-res
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		defer r.lk.Unlock(context.Background())
		d := r.at.Sub(killed)
		t.Logf("advisory lock granted %v after SIGKILL of its holder", d.Round(time.Microsecond))
		// The backend sees end-of-file at once; 1s leaves room for -race
		// on a loaded 2-core machine (typically a few milliseconds).
		if d > time.Second {
			t.Errorf("lock granted %v after the holder died, want within 1s", d)
		}
	})

	t.Run("Lease", func(t *testing.T) {
		t.Parallel()
		const ttl = time.Second
		u := setup(t)
		pool := newPool(t, u, "waiter")
		w := startWorker(t, workerConfig{Role: "lease", ID: "holder", URL: u, Name: "crash", TTL: ttl})
		old := w.await("acquired", time.Minute)

		client := newLeases(t, pool, "waiter")
		if _, err := client.TryAcquire(ctxT(t, 10*time.Second), "crash", ttl); !errors.Is(err, leases.ErrHeld) {
			t.Fatalf("TryAcquire while the worker holds the lease: %v, want ErrHeld", err)
		}
		type result struct {
			l   *leases.Lease
			err error
			at  time.Time
		}
		res := make(chan result, 1)
		ctx := ctxT(t, time.Minute)
		go func() {
			l, err := client.Acquire(ctx, "crash", ttl)
			res <- result{l, err, time.Now()}
		}()
		killed := time.Now()
		w.kill(syscall.SIGKILL)
		r := <-res
		if r.err != nil {
			t.Fatalf("waiter: %v", r.err)
		}
		defer r.l.Release(context.Background())
		d := r.at.Sub(killed)
		t.Logf("lease granted %v after SIGKILL of its holder (TTL %v), fence %d -> %d", d.Round(time.Millisecond), ttl, old.Fence, r.l.Fence())
		// The grant waits for the old grant's expires_at, at most one TTL
		// after the holder's last renewal; +1s covers -race and scheduling.
		if d > ttl+time.Second {
			t.Errorf("lease granted %v after the holder died, want within TTL+1s = %v", d, ttl+time.Second)
		}
		if r.l.Fence() <= old.Fence {
			t.Errorf("new fence %d is not above the dead holder's %d", r.l.Fence(), old.Fence)
		}
	})
}
