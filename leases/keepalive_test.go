package leases

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A renewal statement that is slow but succeeds keeps its lease: when
// renewals slow down (a loaded server, a large batch), the keepalive gives
// the next one longer than TTL/3 rather than cancelling it at every
// attempt until the local deadline passes. PostgreSQL itself is made slow:
// a statement trigger on pgfence.leases sleeps before every update.
func TestKeepaliveSlowRenewals(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `
		CREATE TABLE public.slow (ms int NOT NULL);
		INSERT INTO public.slow VALUES (0);
		CREATE FUNCTION public.slow() RETURNS trigger LANGUAGE plpgsql AS
			$$BEGIN PERFORM pg_sleep((SELECT ms FROM public.slow) / 1000.0); RETURN NULL; END$$;
		CREATE TRIGGER slow BEFORE UPDATE ON pgfence.leases
			FOR EACH STATEMENT EXECUTE FUNCTION public.slow()`); err != nil {
		t.Fatal(err)
	}
	// TTL 6s: renewals every 2s, each attempt given at least 2s, the local
	// deadline 5.4s after a renewal's start.
	const ttl = 6 * time.Second
	l, err := c.TryAcquire(ctx, "slow", ttl)
	if err != nil {
		t.Fatal(err)
	}
	setDelay := func(ms int) {
		t.Helper()
		if _, err := pool.Exec(ctx, `UPDATE public.slow SET ms = $1`, ms); err != nil {
			t.Fatal(err)
		}
	}
	info, err := c.Get(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	// A renewal of 0.9s: slow, within TTL/3.
	setDelay(900)
	at := renewedAfter(t, c, l, info.RenewedAt)
	// Then 2.1s, longer than TTL/3: cancelled at TTL/3 it would be retried
	// with as little time until the deadline passed. Three times the last
	// (2.7s and more) lets it through; so must every one after it.
	setDelay(2100)
	for range 2 {
		at = renewedAfter(t, c, l, at)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost while its renewals were slow but succeeded: %v", err)
	}
	setDelay(0)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Ending the grant of a lease lost at its local deadline may wait for a
// row lock — here a REPEATABLE READ fenced transaction's share lock on the
// lease row, which also made the lease's renewals skip it until it was
// lost — for up to the release timeout (5s). The client's other leases are
// renewed meanwhile: a 3s lease would be lost if the keepalive waited.
func TestKeepaliveNotHeldUpByOrphan(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	stuck, err := c.TryAcquire(ctx, "stuck", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.TryAcquire(ctx, "other", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT FROM pgfence.leases WHERE name = 'stuck' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	<-stuck.Done()
	if !errors.Is(stuck.Err(), ErrLost) {
		t.Fatalf("stuck lease ended with %v, want ErrLost", stuck.Err())
	}
	// The client's release of the lost grant waits for the share lock.
	waitLockWait(t, pool, "release_many")
	info, err := c.Get(ctx, "other")
	if err != nil {
		t.Fatal(err)
	}
	at := info.RenewedAt
	for range 3 { // every second: past the local deadline of a lease not renewed
		at = renewedAfter(t, c, other, at)
	}

	// Close while the release still waits: it cuts that short and ends
	// both grants itself once the lock is gone.
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-other.Done():
	case <-ctx.Done():
		t.Fatal("Close did not end the held lease's context")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Close did not return after the lock was gone")
	}
	var live int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE expires_at > clock_timestamp()`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Errorf("%d grants live after Close", live)
	}
}

// renewedAfter waits for a renewal of l after the one at after and returns
// its time; it fails at once if l is lost instead.
func renewedAfter(t *testing.T, c *Client, l *Lease, after time.Time) time.Time {
	t.Helper()
	ctx := testContext(t)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := c.Get(ctx, l.Name())
		if err != nil {
			t.Fatal(err)
		}
		if info.Fence == l.Fence() && info.RenewedAt.After(after) {
			return info.RenewedAt
		}
		select {
		case <-tick.C:
		case <-l.Done():
			t.Fatalf("lease %q lost while waiting for its renewal: %v", l.Name(), l.Err())
		case <-ctx.Done():
			t.Fatalf("lease %q: no renewal", l.Name())
		}
	}
}

// The bound of a batched renewal: never under minTTL/3, three times the
// slowest recent rate for the batch's size (at least batchFloor leases),
// never past the earliest deadline unless minTTL/3 is; the rate decays by
// 1/8 a batch.
func TestKeepaliveTimeout(t *testing.T) {
	var b renewBuf
	const ttl = 3 * time.Second
	if got := b.timeout(100, ttl, 2*time.Second); got != time.Second {
		t.Errorf("no history: %s, want TTL/3", got)
	}
	b.took(100, 500*time.Millisecond) // 5ms a lease
	if got := b.timeout(100, ttl, 2*time.Second); got != 1500*time.Millisecond {
		t.Errorf("after 5ms a lease, 100 leases: %s, want 1.5s", got)
	}
	if got := b.timeout(200, ttl, 2*time.Second); got != 2*time.Second {
		t.Errorf("after 5ms a lease, 200 leases: %s, want 2s (the earliest deadline)", got)
	}
	if got := b.timeout(200, ttl, 10*time.Millisecond); got != time.Second {
		t.Errorf("deadline in 10ms: %s, want TTL/3", got)
	}
	b.took(100, 100*time.Millisecond) // faster: the rate decays, not drops
	if b.perLease != 5*time.Millisecond-5*time.Millisecond/8 {
		t.Errorf("rate after a faster batch: %s, want 5ms − 1/8", b.perLease)
	}
	b.took(0, time.Second)
	if b.perLease != 5*time.Millisecond-5*time.Millisecond/8 {
		t.Errorf("an empty batch changed the rate to %s", b.perLease)
	}

	// A small batch's round trip does not make a large batch look slow...
	var small renewBuf
	small.took(1, time.Millisecond)
	if got := small.timeout(10000, ttl, 2*time.Second); got != time.Second {
		t.Errorf("10,000 leases after 1 in 1ms: %s, want TTL/3", got)
	}
	// ...but a slow small batch lets the next one take as long.
	var slow renewBuf
	slow.took(1, 2100*time.Millisecond)
	if got := slow.timeout(1, 6*time.Second, 10*time.Second); got != 6300*time.Millisecond {
		t.Errorf("1 lease after 1 in 2.1s: %s, want 6.3s", got)
	}
}
