package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/pglock"
)

// TestKilledBackend terminates the holder's server sessions with
// pg_terminate_backend, as an operator or a crashed backend would. It
// proves that an advisory lock, which lives and dies with its session,
// reports the loss promptly (Done within 1s, Err ErrLost), and that a
// lease, which lives in a table, survives the loss of every connection of
// its client: the keepalive reconnects and renews the same grant.
func TestKilledBackend(t *testing.T) {
	t.Parallel()
	t.Run("AdvisoryLock", func(t *testing.T) {
		t.Parallel()
		u := setup(t)
		admin := newPool(t, u, "admin")
		pool := newPool(t, u, "holder")
		ctx := ctxT(t, time.Minute)
		lk, err := newLocker(t, pool).Lock(ctx, "victim")
		if err != nil {
			t.Fatal(err)
		}
		var pid int32
		err = admin.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&pid)
		if err != nil {
			t.Fatalf("find the lock's backend: %v", err)
		}
		var ok bool
		if err := admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d) = %v, %v", pid, ok, err)
		}
		killed := time.Now()
		select {
		case <-lk.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done did not close within 10s of pg_terminate_backend")
		}
		d := time.Since(killed)
		t.Logf("Done closed %v after pg_terminate_backend", d.Round(time.Microsecond))
		// The contract says about a second; the monitor reads the FATAL
		// message at once (typically well under 100ms, even with -race).
		if d > time.Second {
			t.Errorf("Done closed %v after pg_terminate_backend, want within 1s", d)
		}
		if !errors.Is(lk.Err(), pglock.ErrLost) {
			t.Errorf("Err() = %v, want ErrLost", lk.Err())
		}
		if err := lk.Unlock(ctx); !errors.Is(err, pglock.ErrLost) {
			t.Errorf("Unlock after the loss = %v, want an error wrapping ErrLost", err)
		}
		// The name is free again for everyone, once the backend is gone.
		awaitLocksReleased(t, admin, pid)
		lk2, err := newLocker(t, admin).TryLock(ctx, "victim")
		if err != nil {
			t.Fatalf("TryLock after the loss: %v", err)
		}
		if err := lk2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Lease", func(t *testing.T) {
		t.Parallel()
		const ttl = 2 * time.Second
		u := setup(t)
		admin := newPool(t, u, "admin")
		pool := newPool(t, u, "holder")
		ctx := ctxT(t, time.Minute)
		client := newLeases(t, pool, "holder")
		l, err := client.Acquire(ctx, "survivor", ttl)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())

		// Kill every session of the holder's pool, twice, one renewal
		// apart: the lease must keep being renewed in place.
		for round := 1; round <= 2; round++ {
			var n int
			err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			     WHERE datname = current_database() AND application_name = 'holder'`).Scan(&n)
			if err != nil || n == 0 {
				t.Fatalf("terminate the holder's sessions: %d terminated, %v", n, err)
			}
			var killedAt time.Time // database clock, after the terminations
			if err := admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&killedAt); err != nil {
				t.Fatal(err)
			}
			mustWait(t, ttl, "a renewal after the holder's sessions were terminated", func() (bool, error) {
				row, ok, err := readLease(ctx, admin, "survivor")
				return ok && row.RenewedAt.After(killedAt), err
			})
			row, _, err := readLease(ctx, admin, "survivor")
			if err != nil {
				t.Fatal(err)
			}
			if row.Fence != l.Fence() || row.Owner != l.Owner() {
				t.Errorf("round %d: row is %+v, want the same grant (fence %d owner %s)", round, row, l.Fence(), l.Owner())
			}
			if err := l.Err(); err != nil {
				t.Fatalf("round %d: lease lost after its connections were terminated: %v", round, err)
			}
			t.Logf("round %d: %d sessions terminated, renewed %v later (database clock)", round, n, row.RenewedAt.Sub(killedAt).Round(time.Millisecond))
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release: %v", err)
		}
	})
}
