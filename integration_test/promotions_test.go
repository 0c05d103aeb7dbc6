package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
)

// TestDoublePromotion is the two-promotions-in-a-row case of fence
// integrity: a primary P with two asynchronous standbys S1 and S2 (no
// shared WAL archive). P crashes and S1 is promoted (timeline 2); a grant
// there gets fence F and its holder writes a fenced row. S1 crashes before
// S2 ever streams from it; S2, which only followed P, is promoted and
// reaches timeline 2 as well — a different history with the same timeline
// number. The next grant of the same lease on S2 must get a fence above F,
// and the old holder, reconnecting through a multi-host URL, must have its
// token rejected: on the lease alone, and again after the protected row it
// wrote on S1 is copied over (as a repair would).
func TestDoublePromotion(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t, 3*time.Minute)
	p := pgtest.StartCluster(t)
	if err := migrations.Up(ctx, p.URL("postgres")); err != nil {
		t.Fatalf("migrate the primary: %v", err)
	}
	poolP := newPool(t, p.URL("postgres"), "promotions-p")
	protectedTable(t, poolP, "promo_items", "id int PRIMARY KEY, holder text NOT NULL")
	// The lease has a history on P: granted and released once.
	first, err := newLeases(t, poolP, "p").TryAcquire(ctx, "promo/job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s1 := startStandbyOf(t, p, "s1")
	s2 := startStandbyOf(t, p, "s2")
	waitReplayed(t, p, s1, s2)

	// P crashes; S1 is promoted and grants the lease.
	if err := p.Kill(); err != nil {
		t.Fatalf("kill P: %v", err)
	}
	if err := s1.Promote(ctx); err != nil {
		t.Fatalf("promote S1: %v", err)
	}
	tl1 := timelineOf(t, s1)
	// The old holder's pool follows the primary: S1, then S2.
	oldURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=3",
		s1.Port(), s2.Port())
	poolOld := newPool(t, oldURL, "promotions-old")
	old, err := newLeases(t, poolOld, "old").TryAcquire(ctx, "promo/job", 10*time.Second)
	if err != nil {
		t.Fatalf("grant on S1: %v", err)
	}
	if err := fencing.InTx(ctx, poolOld, old.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO promo_items (id, holder) VALUES (1, 'old')`)
		return err
	}); err != nil {
		t.Fatalf("fenced write on S1: %v", err)
	}
	var rowFence int64
	if err := poolOld.QueryRow(ctx, `SELECT fence FROM promo_items WHERE id = 1`).Scan(&rowFence); err != nil {
		t.Fatal(err)
	}
	t.Logf("S1 (timeline %d) granted promo/job with fence %d; the holder wrote row 1", tl1, old.Fence())

	// S1 crashes before S2 streams from it; S2 is promoted.
	if err := s1.Kill(); err != nil {
		t.Fatalf("kill S1: %v", err)
	}
	if err := s2.Promote(ctx); err != nil {
		t.Fatalf("promote S2: %v", err)
	}
	tl2 := timelineOf(t, s2)
	if tl2 != tl1 {
		t.Logf("S2 is on timeline %d, S1 was on %d", tl2, tl1)
	} else {
		t.Logf("S2 reached timeline %d too: the same number, another history", tl2)
	}

	poolNew := newPool(t, s2.URL("postgres"), "promotions-new")
	nw, err := newLeases(t, poolNew, "new").TryAcquire(ctx, "promo/job", time.Minute)
	if err != nil {
		t.Fatalf("grant on S2: %v", err)
	}
	if nw.Fence() <= old.Fence() {
		t.Errorf("S2 granted promo/job fence %d, not above fence %d that S1 granted before it: the old holder's token is as good as the new one's", nw.Fence(), old.Fence())
	}

	// The old holder comes back through its multi-host URL, now to S2
	// (its pool first finds its connections to S1 dead).
	err = untilAnswered(ctx, func() error {
		return fencing.InTx(ctx, poolOld, old.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO promo_items (id, holder) VALUES (1, 'old-on-s2')`)
			return err
		})
	})
	if !fencing.IsStale(err) {
		t.Errorf("the old holder's write on S2 (no row yet) = %v, want stale", err)
	}
	// The row S1's holder wrote is copied over, bypassing triggers, as a
	// repair or a pg_dump --disable-triggers restore would.
	withoutGuard(t, poolNew, `DELETE FROM promo_items WHERE id = 1`,
		fmt.Sprintf(`INSERT INTO promo_items (id, holder, fence) VALUES (1, 'old', %d)`, rowFence))
	err = untilAnswered(ctx, func() error {
		return fencing.InTx(ctx, poolOld, old.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `UPDATE promo_items SET holder = 'old-again' WHERE id = 1`)
			return err
		})
	})
	if !fencing.IsStale(err) {
		t.Errorf("the old holder's write on S2 after the row was copied over = %v, want stale", err)
	}
	if err := fencing.InTx(ctx, poolNew, nw.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE promo_items SET holder = 'new' WHERE id = 1`)
		return err
	}); err != nil {
		t.Errorf("the new holder's write on S2: %v", err)
	}
	// And the old holder is told it lost the lease.
	select {
	case <-old.Done():
		if !errors.Is(old.Err(), leases.ErrLost) {
			t.Errorf("old lease: Err() = %v, want ErrLost", old.Err())
		}
	case <-time.After(20 * time.Second): // TTL 10s: its deadline ends it by then
		t.Errorf("the old holder was not told it lost promo/job")
	}
	if err := nw.Release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
}

// withoutGuard runs statements in one transaction with triggers off
// (session_replication_role replica), as a superuser's repair would.
func withoutGuard(t *testing.T, pool *pgxpool.Pool, statements ...string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, q := range append([]string{`SET LOCAL session_replication_role = replica`}, statements...) {
			if _, err := tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// untilAnswered runs op until it returns nil or an answer from a working
// server — not a dead connection that a pool hands out once after a crash
// (no SQLSTATE, or class 08 connection exception or 57 operator
// intervention) — for at most 20s, and returns its last result.
func untilAnswered(ctx context.Context, op func() error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := op()
		code := sqlstateOf(err)
		answered := code != "" && !strings.HasPrefix(code, "08") && !strings.HasPrefix(code, "57")
		if err == nil || answered || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // the pool reconnects on the next attempt
	}
}

// startStandbyOf makes an asynchronous streaming standby of c named name,
// removed at the end of the test.
func startStandbyOf(t *testing.T, c *pgtest.Cluster, name string) *pgcluster.Cluster {
	t.Helper()
	s, err := c.NewStandby(pgcluster.WithStandbyName(name))
	if err != nil {
		t.Fatalf("start standby %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("remove standby %s: %v", name, err)
		}
	})
	return s
}

// waitReplayed waits until every standby has replayed the primary's WAL up
// to its current insert position.
func waitReplayed(t *testing.T, primary *pgtest.Cluster, standbys ...*pgcluster.Cluster) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	var lsn string
	if err := haConn(t, primary.URL("postgres")).QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatalf("read the primary's WAL position: %v", err)
	}
	for _, s := range standbys {
		conn := haConn(t, s.URL("postgres"))
		mustWait(t, 30*time.Second, "a standby to replay "+lsn, func() (bool, error) {
			var done bool
			err := conn.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, lsn).Scan(&done)
			return done, err
		})
	}
}

// sqlTimeline reads the WAL timeline a primary writes on.
const sqlTimeline = `SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint`

// timelineOf is the WAL timeline primary c writes on.
func timelineOf(t *testing.T, c *pgcluster.Cluster) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tl int64
	if err := haConn(t, c.URL("postgres")).QueryRow(ctx, sqlTimeline).Scan(&tl); err != nil {
		t.Fatalf("read the timeline: %v", err)
	}
	return tl
}
