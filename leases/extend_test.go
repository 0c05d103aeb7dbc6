package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Extend to a longer TTL: PostgreSQL's expires_at moves to now + the new
// TTL, the local deadline follows the same rule, and the keepalive renews
// with the new TTL.
func TestExtendLonger(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "extend", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	if err := l.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if l.TTL() != time.Minute {
		t.Errorf("TTL after Extend: %s, want 1m", l.TTL())
	}
	info, err := c.Get(ctx, "extend")
	if err != nil {
		t.Fatal(err)
	}
	// renewed_at and expires_at are two reads of the database clock, a few
	// microseconds apart: expires_at − renewed_at is the TTL plus that.
	if d := info.ExpiresAt.Sub(info.RenewedAt); d < time.Minute-time.Second || d > time.Minute+time.Second {
		t.Errorf("server grant after Extend: expires %s after renewal, want 1m", d)
	}
	c.mu.Lock()
	deadline, next := l.deadline, l.nextRenew
	c.mu.Unlock()
	// start + 1m − 6s, with start between begin and now.
	if lo, hi := begin.Add(54*time.Second), time.Now().Add(54*time.Second); deadline.Before(lo) || deadline.After(hi) {
		t.Errorf("local deadline %s after begin, want 54s", deadline.Sub(begin))
	}
	if next.Sub(begin) < 19*time.Second {
		t.Errorf("next renewal %s after begin, want 20s (TTL/3 of the new TTL)", next.Sub(begin))
	}
	if err := l.Extend(ctx, time.Second/2); !errors.Is(err, ErrInvalid) {
		t.Errorf("Extend below MinTTL: %v, want ErrInvalid", err)
	}
	if l.TTL() != time.Minute {
		t.Errorf("a refused Extend changed the TTL to %s", l.TTL())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, time.Minute); !errors.Is(err, ErrReleased) {
		t.Errorf("Extend after Release: %v, want ErrReleased", err)
	}
}

// Extend to a shorter TTL moves the local deadline earlier, as the rule
// says, and the keepalive renews with the short TTL from then on: the
// lease stays held across several of its renewals.
func TestExtendShorterKeepsRule(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "shorter", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	var renewedAt time.Time
	// Three renewals of the 1.5s TTL (every 0.5s), each by the keepalive.
	for i := 0; i < 3; i++ {
		waitFor(t, pool, `SELECT renewed_at > $1 FROM pgfence.leases WHERE name = 'shorter'`, renewedAt)
		info, err := c.Get(ctx, "shorter")
		if err != nil {
			t.Fatal(err)
		}
		if d := info.ExpiresAt.Sub(info.RenewedAt); d < 1400*time.Millisecond || d > 1510*time.Millisecond {
			t.Errorf("renewal %d: expires %s after renewal, want 1.5s", i, d)
		}
		renewedAt = info.RenewedAt
	}
	if err := l.Err(); err != nil {
		t.Errorf("lease lost while renewed with the new TTL: %v", err)
	}

	// Without renewals, the new, shorter deadline ends the context well
	// before the old TTL — and before PostgreSQL's expiry. The new TTL is
	// 10s so that the margin (1s) dwarfs the time between Done firing and
	// the query below reaching the server, even under -race in a container
	// on a loaded machine: with a 1s TTL its 100ms margin was too thin (CI
	// once read the grant expired).
	f, fpool := setup(t)
	freeze(f)
	l2, err := f.TryAcquire(ctx, "frozen", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const short = 10 * time.Second
	begin := time.Now()
	if err := l2.Extend(ctx, short); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l2.Done():
	case <-time.After(short + 10*time.Second):
		t.Fatal("lease not lost at the shorter deadline")
	}
	// The deadline counts from the start of the Extend request, never
	// earlier: no lease is lost before TTL − margin.
	if d := time.Since(begin); d < short-short/10 {
		t.Errorf("lease lost %s after Extend, before TTL − margin (%s)", d, short-short/10)
	}
	var live bool
	if err := fpool.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE name = 'frozen'`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if !live || !errors.Is(l2.Err(), ErrLost) {
		t.Errorf("at the local deadline: server grant live %v, lease %v; want live and ErrLost", live, l2.Err())
	}
}

// TestExtendShorterAnswerLost (scenario: Extend to a shorter TTL waits for
// the lease row's lock — an operator's transaction, a REPEATABLE READ
// fenced writer — and its context ends first). The statement still runs
// and commits once the lock is free: the server's expires_at is then the
// short one. The holder must keep the short TTL too, so that its local
// deadline stays before the server's expiry and no other client is granted
// the lease while its Context is alive.
func TestExtendShorterAnswerLost(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	c := newClient(t, pool)
	other := newClient(t, pgtest.PoolFor(t, url))
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "job", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE name = 'job' FOR SHARE`); err != nil {
		t.Fatal(err)
	}
	const short = 2 * time.Second
	ectx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = l.Extend(ectx, short)
	cancel()
	if err == nil {
		t.Fatal("Extend returned nil while the row was locked past its context")
	}
	if got := l.TTL(); got != short {
		t.Errorf("after a shorter Extend whose answer was lost, TTL = %v, want %v (it may have committed)", got, short)
	}
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// For 3 TTLs, long past the short expiry the lost statement set: the
	// lease is either still renewed (nobody else gets it) or lost before
	// another client is granted it. Polled: only the database can tell.
	for end := time.Now().Add(3 * short); time.Now().Before(end); {
		o, err := other.TryAcquire(ctx, "job", time.Minute)
		if err == nil {
			if l.Err() == nil {
				t.Fatalf("another client was granted the lease (fence %d) while the holder's Context (fence %d) is alive", o.Fence(), l.Fence())
			}
			return
		}
		if !errors.Is(err, ErrHeld) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := l.Err(); err != nil {
		t.Errorf("lease lost although renewed with the short TTL: %v", err)
	}
}
