package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/pglock"
)

// TestRestart restarts a server of the test's own — a fast shutdown, then
// an immediate one (crash recovery) — while this process holds a lease and
// an advisory lock. It proves that leases persist across restarts (the
// grant is a row) and the keepalive resumes renewing the same grant; that
// every fence granted after a restart exceeds every fence granted before
// (the sequence is WAL-logged); and that advisory locks, which die with the
// server's sessions, are reported lost (Done closes, Err is ErrLost).
func TestRestart(t *testing.T) {
	t.Parallel()
	// Long enough that a restart fits in the holder's local deadline
	// (TTL - TTL/10 = 27s after the last renewal, which is at most TTL/3
	// old when the server stops) even under -race on a busy machine: a
	// restart takes 1.5s on a quiet one, but with 10s CI once lost the
	// lease while the Docker engine was busy building images for other
	// tests.
	const ttl = 30 * time.Second
	srv := startServer(t)
	u := srv.URL("postgres")
	assertNoAdvisoryLocks(t, u)
	admin := newPool(t, u, "admin")
	holder := newPool(t, u, "holder")
	ctx := ctxT(t, 3*time.Minute)

	client := newLeases(t, holder, "holder")
	l, err := client.Acquire(ctx, "survivor", ttl)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())

	for _, mode := range []string{"fast", "immediate"} {
		t.Run(mode, func(t *testing.T) {
			lk, err := newLocker(t, holder).Lock(ctx, "restart-"+mode)
			if err != nil {
				t.Fatal(err)
			}
			var highest int64 // every fence handed out so far is at most this
			// Nothing prunes lease rows here, and each keeps its lease's
			// latest fence.
			if err := admin.QueryRow(ctx, "SELECT coalesce(max(fence), 0) FROM pgfence.leases").Scan(&highest); err != nil {
				t.Fatal(err)
			}

			stopping := time.Now()
			if err := srv.Stop(mode); err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			down := time.Since(stopping)

			select {
			case <-lk.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("the advisory lock's Done did not close within 10s of the restart")
			}
			if !errors.Is(lk.Err(), pglock.ErrLost) {
				t.Errorf("advisory lock Err() = %v, want ErrLost", lk.Err())
			}
			if err := lk.Unlock(ctx); !errors.Is(err, pglock.ErrLost) {
				t.Errorf("Unlock of the lost lock = %v, want an error wrapping ErrLost", err)
			}

			// Pooled connections died with the server: the first uses of
			// them fail, which waitFor retries.
			var restarted time.Time
			mustWait(t, 30*time.Second, "the server's clock after the restart", func() (bool, error) {
				err := admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&restarted)
				return err == nil, err
			})
			var row leaseRow
			mustWait(t, ttl, "the keepalive to renew the lease after the restart", func() (bool, error) {
				if err := l.Err(); err != nil {
					t.Fatalf("lease lost across the %s restart (server down and up in %v): %v", mode, down.Round(time.Millisecond), err)
				}
				r, ok, err := readLease(ctx, admin, "survivor")
				row = r
				return ok && r.RenewedAt.After(restarted), err
			})
			if err := l.Err(); err != nil {
				t.Fatalf("lease lost across the %s restart: %v", mode, err)
			}
			if row.Fence != l.Fence() || row.Owner != l.Owner() {
				t.Errorf("lease row after the restart: %+v, want fence %d owner %s", row, l.Fence(), l.Owner())
			}

			next, err := client.Acquire(ctx, "after-"+mode, ttl)
			if err != nil {
				t.Fatal(err)
			}
			if next.Fence() <= highest {
				t.Errorf("fence granted after the %s restart (%d) does not exceed the highest before it (%d)", mode, next.Fence(), highest)
			}
			if err := next.Release(ctx); err != nil {
				t.Error(err)
			}
			t.Logf("%s restart: server down and up in %v; lease kept (fence %d), renewed %v after start; next fence %d > %d",
				mode, down.Round(time.Millisecond), l.Fence(), row.RenewedAt.Sub(restarted).Round(time.Millisecond), next.Fence(), highest)
		})
	}
}
