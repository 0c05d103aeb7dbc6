package integration_test

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/redact"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// TestPartition puts a TCP proxy between the holder and the database and
// blackholes it: packets stop flowing in both directions but no socket is
// closed, so neither side learns anything from the network. It proves
// guarantee 4 — the holder learns of the loss before anyone else can take
// over: a lease's context is cancelled while the server's expires_at is
// still in the future (compared on the database's clock, read over a direct
// connection), and an advisory lock's Done closes within the liveness
// check's interval+timeout.
func TestPartition(t *testing.T) {
	t.Parallel()
	t.Run("Lease", func(t *testing.T) {
		t.Parallel()
		const ttl = 2 * time.Second
		u := setup(t)
		admin := newPool(t, u, "admin")
		p := startProxy(t, hostPort(t, u))
		holder := newPool(t, p.URL(t, u), "holder")
		ctx := ctxT(t, time.Minute)
		client := newLeases(t, holder, "holder")
		l, err := client.Acquire(ctx, "partitioned", ttl)
		if err != nil {
			t.Fatal(err)
		}

		p.Blackhole()
		start := time.Now()
		select {
		case <-l.Done():
		case <-time.After(ttl + 10*time.Second):
			t.Fatalf("lease context not cancelled within TTL+10s of the partition")
		}
		row, ok, err := readLease(ctx, admin, "partitioned")
		if err != nil || !ok {
			t.Fatalf("read the lease's row: ok=%v err=%v", ok, err)
		}
		t.Logf("lease context cancelled %v after the partition; the server's grant had %v left (database clock)",
			time.Since(start).Round(time.Millisecond), row.ExpiresAt.Sub(row.Now).Round(time.Millisecond))
		if !row.live() {
			t.Errorf("the holder learned of the loss only after the server's expires_at (%v late)", row.Now.Sub(row.ExpiresAt))
		}
		if row.Fence != l.Fence() {
			t.Errorf("row has fence %d, want the holder's %d", row.Fence, l.Fence())
		}
		if !errors.Is(l.Err(), leases.ErrLost) {
			t.Errorf("Err() = %v, want ErrLost", l.Err())
		}
		// Heal the network so that the holder can clean up.
		p.Cut()
		p.Heal()
		if err := l.Release(ctx); !errors.Is(err, leases.ErrLost) {
			t.Errorf("Release of the lost lease = %v, want an error wrapping ErrLost", err)
		}
	})

	t.Run("AdvisoryLock", func(t *testing.T) {
		t.Parallel()
		const interval, timeout = 200 * time.Millisecond, 300 * time.Millisecond
		u := setup(t)
		admin := newPool(t, u, "admin")
		p := startProxy(t, hostPort(t, u))
		holder := newPool(t, p.URL(t, u), "holder")
		ctx := ctxT(t, time.Minute)
		lk, err := newLocker(t, holder, pglock.WithLivenessCheck(interval, timeout)).Lock(ctx, "partitioned")
		if err != nil {
			t.Fatal(err)
		}

		p.Blackhole()
		start := time.Now()
		select {
		case <-lk.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done did not close within 10s of the partition")
		}
		d := time.Since(start)
		t.Logf("Done closed %v after the partition (liveness interval %v + timeout %v)", d.Round(time.Millisecond), interval, timeout)
		// interval+timeout is the contract; 500ms more for -race and a
		// loaded machine.
		if bound := interval + timeout + 500*time.Millisecond; d > bound {
			t.Errorf("Done closed %v after the partition, want within %v", d, bound)
		}
		if !errors.Is(lk.Err(), pglock.ErrLost) {
			t.Errorf("Err() = %v, want ErrLost", lk.Err())
		}

		// The server cannot tell a silent client from a slow one: behind the
		// partition its session still holds the lock. This is why fenced
		// writes matter (see TestPause). Once the network heals, the
		// closed connection reaches it and the lock goes.
		var n int
		if err := admin.QueryRow(ctx, sqlCountAdvisoryLocks).Scan(&n); err != nil {
			t.Fatal(err)
		}
		t.Logf("advisory locks still held server-side behind the partition: %d", n)
		p.Heal()
		mustWait(t, 10*time.Second, "the server to drop the partitioned session's lock", func() (bool, error) {
			err := admin.QueryRow(ctx, sqlCountAdvisoryLocks).Scan(&n)
			return n == 0, err
		})
		if err := lk.Unlock(ctx); !errors.Is(err, pglock.ErrLost) {
			t.Errorf("Unlock of the lost lock = %v, want an error wrapping ErrLost", err)
		}
	})
}

// hostPort is the host:port of a database URL.
func hostPort(t *testing.T, databaseURL string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("parse the database URL: %v", redact.ErrorFor(err, databaseURL))
	}
	return u.Host
}
