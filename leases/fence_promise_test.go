package leases

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promise (docs/design.md, "Fences"): per lease, fences strictly
// increase "whatever the clock does (an NTP step backwards changes
// nothing)", because a grant's fence is at least the lease's previous fence
// + 1; and releases and force-releases draw no fence, leaving the row's
// fence for the next grant to exceed.
//
// With a live clock, fences increase anyway, so a test that merely takes a
// lease twice cannot tell whether the previous-fence term is there. This
// one puts the database clock behind a lease's last fence — the row's
// fence is set an hour ahead of the clock, as a clock stepped back by an
// hour after that grant would leave it — and checks every way a grant is
// drawn: the fast path, the upsert behind a former holder's open fenced
// transaction, and a semaphore slot.

// fenceAhead expires lease name's row and sets its fence an hour ahead of
// the database clock, as if the clock had stepped back since its grant.
// It returns that fence.
func fenceAhead(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	var fence int64
	err := pool.QueryRow(ctx, `UPDATE pgfence.leases
   SET fence = (extract(epoch FROM clock_timestamp() + interval '1 hour') * 1000000)::bigint,
       expires_at = clock_timestamp()
 WHERE name = $1 RETURNING fence`, name).Scan(&fence)
	if err != nil {
		t.Fatalf("set the fence of %s ahead: %v", name, err)
	}
	return fence
}

// rowFence returns the fence in lease name's row.
func rowFence(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) int64 {
	t.Helper()
	var fence int64
	if err := pool.QueryRow(ctx, `SELECT fence FROM pgfence.leases WHERE name = $1`, name).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	return fence
}

func TestFencesIncreaseWhenTheClockIsBehind(t *testing.T) {
	c, pool := setup(t)
	ctx := testContext(t)
	const ttl = time.Minute

	// The fast path.
	l, err := c.TryAcquire(ctx, "behind/fast", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rowFence(t, ctx, pool, "behind/fast"); got != l.Fence() {
		t.Errorf("after Release the row's fence is %d, want the grant's %d: a release draws no fence", got, l.Fence())
	}
	prev := fenceAhead(t, ctx, pool, "behind/fast")
	l, err = c.TryAcquire(ctx, "behind/fast", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= prev {
		t.Errorf("fast path: the grant's fence %d does not exceed the previous %d (the clock is behind it)", l.Fence(), prev)
	}
	op := newClient(t, pool)
	if err := op.ForceRelease(ctx, "behind/fast"); err != nil {
		t.Fatal(err)
	}
	if got := rowFence(t, ctx, pool, "behind/fast"); got != l.Fence() {
		t.Errorf("after ForceRelease the row's fence is %d, want the grant's %d: a force-release draws no fence", got, l.Fence())
	}

	// The upsert, taken when a former holder's fenced transaction still
	// holds the lease's fence lock: the grant waits for it, then draws.
	l, err = c.TryAcquire(ctx, "behind/upsert", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	prev = fenceAhead(t, ctx, pool, "behind/upsert")
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(1885824614, hashtext('behind/upsert'))`); err != nil {
		t.Fatal(err)
	}
	type granted struct {
		l   *Lease
		err error
	}
	done := make(chan granted, 1)
	go func() {
		l, err := c.TryAcquire(ctx, "behind/upsert", ttl)
		done <- granted{l, err}
	}()
	pgtest.WaitFor(t, testTimeout, "the grant to wait for the fence lock", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND NOT granted AND classid = 1885824614 AND objid = hashtext('behind/upsert')::oid`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-done
	if g.err != nil {
		t.Fatal(g.err)
	}
	if g.l.Fence() <= prev {
		t.Errorf("upsert path: the grant's fence %d does not exceed the previous %d (the clock is behind it)", g.l.Fence(), prev)
	}

	// A semaphore slot.
	sem, err := c.Semaphore("behind/sem", 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err = sem.TryAcquire(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	prev = fenceAhead(t, ctx, pool, "behind/sem#1")
	l, err = sem.TryAcquire(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= prev {
		t.Errorf("slot: the grant's fence %d does not exceed the previous %d (the clock is behind it)", l.Fence(), prev)
	}
}
