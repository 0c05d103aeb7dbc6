//go:build linux

package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgcluster"
)

// TestPatroniDoublePromotion is TestDoublePromotion on Patroni: two
// promotions in a row where the second candidate never saw the first's
// timeline. One replica (R2) is cut off; a switchover promotes the other
// (R1, timeline 2), where a lease is granted and its holder writes a fenced
// row; then R1 and the old primary die before R2 streams anything from
// R1. R2 is reconnected: its lag is within maximum_lag_on_failover, so
// Patroni promotes it, to timeline 2 as well. The next grant of the lease
// there must exceed R1's fence, and R1's holder's token must be stale.
func TestPatroniDoublePromotion(t *testing.T) {
	t.Parallel()
	p := startPatroni(t)
	ctx := ctxT(t, 3*time.Minute)
	first := mustLeader(t, p)
	var r1, r2 *pgcluster.PatroniNode
	for _, n := range p.Nodes() {
		switch {
		case n == first:
		case r1 == nil:
			r1 = n
		default:
			r2 = n
		}
	}
	mh := newPool(t, p.URL("postgres"), "promo-multihost")
	protectedTable(t, mh, "promo_items", "id int PRIMARY KEY, holder text NOT NULL")
	history, err := newLeases(t, mh, "first").TryAcquire(ctx, "promo/job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := history.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitHealthy(time.Minute); err != nil {
		t.Fatal(err)
	}
	// R2 has everything so far — the schema included — before it is cut
	// off: Patroni calls a replica healthy while it still lags a little.
	var lsn string
	if err := mh.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	r2conn := haConn(t, r2.URL("postgres"))
	mustWait(t, time.Minute, r2.Name()+" to replay "+lsn, func() (bool, error) {
		var done bool
		err := r2conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
		return done, err
	})

	if err := r2.Isolate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Heal() })
	if err := p.Switchover(ctxT(t, time.Minute), r1); err != nil {
		t.Fatal(err)
	}
	old, err := newLeases(t, mh, "old").TryAcquire(ctx, "promo/job", 10*time.Second)
	if err != nil {
		t.Fatalf("grant on %s: %v", r1.Name(), err)
	}
	tl1 := timelineVia(t, mh)
	if err := fencing.InTx(ctx, mh, old.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO promo_items (id, holder) VALUES (1, 'old')`)
		return err
	}); err != nil {
		t.Fatalf("fenced write on %s: %v", r1.Name(), err)
	}
	t.Logf("%s leads on timeline %d and granted promo/job fence %d", r1.Name(), tl1, old.Fence())

	r1.Kill()
	first.Kill()
	healed := time.Now()
	if err := r2.Heal(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitLeader(90*time.Second, r1, first); err != nil {
		t.Fatalf("%s was not promoted: %v", r2.Name(), err)
	}
	tl2 := timelineVia(t, mh)
	t.Logf("%s promoted %v after it was reconnected, on timeline %d (%s was on %d)", r2.Name(), time.Since(healed).Round(time.Millisecond), tl2, r1.Name(), tl1)

	nw, err := newLeases(t, mh, "new").TryAcquire(ctx, "promo/job", time.Minute)
	for err != nil && sqlstateOf(err) == "" { // the pool's dead connections first
		nw, err = newLeases(t, mh, "new").TryAcquire(ctx, "promo/job", time.Minute)
	}
	if err != nil {
		t.Fatalf("grant on %s: %v", r2.Name(), err)
	}
	if nw.Fence() <= old.Fence() {
		t.Errorf("%s granted promo/job fence %d, not above fence %d granted on %s before it", r2.Name(), nw.Fence(), old.Fence(), r1.Name())
	}
	err = untilAnswered(ctx, func() error {
		return fencing.InTx(ctx, mh, old.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO promo_items (id, holder) VALUES (1, 'old-again')`)
			return err
		})
	})
	if !fencing.IsStale(err) {
		t.Errorf("the old holder's write on %s = %v, want stale", r2.Name(), err)
	}
	_ = nw.Release(ctx)
}

// timelineVia is the WAL timeline of the primary that pool reaches.
func timelineVia(t *testing.T, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int64 {
	t.Helper()
	var tl int64
	err := untilAnswered(context.Background(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return pool.QueryRow(ctx, sqlTimeline).Scan(&tl)
	})
	if err != nil {
		t.Fatalf("read the timeline: %v", err)
	}
	return tl
}
