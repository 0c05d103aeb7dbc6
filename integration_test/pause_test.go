package integration_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
)

// TestPause is Kleppmann's scenario: a holder process stops (SIGSTOP, as a
// long GC pause or a frozen VM would) past the point where its hold ends,
// someone else takes over and writes, and then the old holder resumes
// believing it still holds, and writes. The database must reject that
// write.
func TestPause(t *testing.T) {
	t.Parallel()
	t.Run("Lease", testPauseLease)
	t.Run("AdvisoryLock", testPauseAdvisoryLock)
}

// testPauseLease: the lease's grant expires by the database clock while the
// holder is stopped; the successor's grant has a higher fence. The old
// holder's fenced write is rejected (ErrStale: its token is not the lease's
// current grant, and lower than the row's fence) and its renewal finds the
// grant gone (ErrLost).
func testPauseLease(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	u := setup(t)
	pool := newPool(t, u, "successor")
	protectedTable(t, pool, "resource", "id int PRIMARY KEY, holder text NOT NULL")

	w := startWorker(t, workerConfig{Role: "lease", ID: "old", URL: u, Name: "pause", TTL: ttl, Table: "resource"})
	old := w.await("acquired", time.Minute)
	w.send("write")
	if ev := w.await("write", 30*time.Second); ev.Result != "ok" {
		t.Fatalf("the holder's own write before the pause: %s %s", ev.Result, ev.Err)
	}

	w.kill(syscall.SIGSTOP)
	stopped := time.Now()
	ctx := ctxT(t, time.Minute)
	mustWait(t, 10*time.Second, "the stopped holder's grant to expire by the database clock", func() (bool, error) {
		row, ok, err := readLease(ctx, pool, "pause")
		return ok && !row.live(), err
	})
	client := newLeases(t, pool, "successor")
	l, err := client.Acquire(ctx, "pause", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if l.Fence() <= old.Fence {
		t.Fatalf("successor's fence %d is not above the stopped holder's %d", l.Fence(), old.Fence)
	}
	writeResource(t, pool, l.Token(), "successor")
	t.Logf("holder stopped for %v; successor fence %d > %d", time.Since(stopped).Round(time.Millisecond), l.Fence(), old.Fence)

	w.kill(syscall.SIGCONT)
	w.send("write")
	w.send("renew")
	if ev := w.await("write", 30*time.Second); ev.Result != "stale" {
		t.Errorf("resumed holder's fenced write: %s (%s), want it rejected as stale", ev.Result, ev.Err)
	} else {
		t.Logf("resumed holder's write rejected: %s", ev.Err)
	}
	if ev := w.await("renew", 30*time.Second); ev.Result != "lost" {
		t.Errorf("resumed holder's renewal: %s (%s), want ErrLost", ev.Result, ev.Err)
	}
	if ev := w.await("lost", 30*time.Second); ev.Result != "lost" {
		t.Errorf("resumed holder's lease ended with %q, want ErrLost", ev.Err)
	}
	w.finish(30 * time.Second)
	assertResource(t, pool, "successor", l.Fence())
}

// testPauseAdvisoryLock: an advisory lock has no fence of its own, so each
// holder, once it holds the lock, takes a short lease for its fence (a
// later holder's fence is always higher) and writes protected rows through
// fencing.InTx with the lease's token.
//
// The server ends the stopped holder's session (idle_session_timeout=1s,
// set on the test's database with ALTER DATABASE, so no cluster of its own
// is needed; this process's sessions override it at connection time),
// which releases the lock; the successor takes it, draws a higher fence and
// writes. The old holder resumes: its Done closes with ErrLost and its
// fenced write is rejected.
func testPauseAdvisoryLock(t *testing.T) {
	t.Parallel()
	u := setup(t)
	pool := newPool(t, u, "successor", func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["idle_session_timeout"] = "0"
	})
	mustExec(t, pool, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idle_session_timeout = %L', current_database(), '1s'); END $$`)
	protectedTable(t, pool, "resource", "id int PRIMARY KEY, holder text NOT NULL")

	// A long liveness interval keeps the monitor from pinging, so that the
	// session really is idle; a session ended by the server is noticed
	// without a ping anyway.
	w := startWorker(t, workerConfig{Role: "lock", ID: "old", URL: u, Name: "pause", Table: "resource",
		LivenessInterval: time.Minute, LivenessTimeout: 3 * time.Second})
	old := w.await("acquired", time.Minute)
	w.send("write")
	if ev := w.await("write", 30*time.Second); ev.Result != "ok" {
		t.Fatalf("the holder's own write before the pause: %s %s", ev.Result, ev.Err)
	}

	w.kill(syscall.SIGSTOP)
	stopped := time.Now()
	ctx := ctxT(t, time.Minute)
	lk, err := newLocker(t, pool).Lock(ctx, "pause")
	if err != nil {
		t.Fatalf("successor's Lock: %v", err)
	}
	defer lk.Unlock(context.Background())
	t.Logf("successor got the lock %v after the holder stopped (idle_session_timeout 1s)", time.Since(stopped).Round(time.Millisecond))
	lc := newLeases(t, pool, "successor")
	fl, err := lc.Acquire(ctx, "pause/fence", time.Second) // the stopped holder's expires within 1s
	if err != nil {
		t.Fatal(err)
	}
	fence := fl.Fence()
	if fence <= old.Fence {
		t.Fatalf("successor's fence %d is not above the stopped holder's %d", fence, old.Fence)
	}
	writeResource(t, pool, fl.Token(), "successor")

	w.kill(syscall.SIGCONT)
	w.send("write")
	if ev := w.await("write", 30*time.Second); ev.Result != "stale" {
		t.Errorf("resumed holder's fenced write: %s (%s), want it rejected as stale", ev.Result, ev.Err)
	} else {
		t.Logf("resumed holder's write rejected: %s", ev.Err)
	}
	if ev := w.await("lost", 30*time.Second); ev.Result != "lost" {
		t.Errorf("resumed holder's lock ended with %q, want ErrLost", ev.Err)
	}
	w.finish(30 * time.Second)
	assertResource(t, pool, "successor", fence)
}

// writeResource upserts row 1 of resource through fencing.InTx.
func writeResource(t *testing.T, pool *pgxpool.Pool, tok fencing.Token, holder string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	err := fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO resource (id, holder) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder", holder)
		return err
	})
	if err != nil {
		t.Fatalf("%s's fenced write with %v: %v", holder, tok, err)
	}
}

// assertResource checks who last wrote row 1 of resource, and with which fence.
func assertResource(t *testing.T, pool *pgxpool.Pool, holder string, fence int64) {
	t.Helper()
	var h string
	var f int64
	if err := pool.QueryRow(ctxT(t, 30*time.Second), "SELECT holder, fence FROM resource WHERE id = 1").Scan(&h, &f); err != nil {
		t.Fatal(err)
	}
	if h != holder || f != fence {
		t.Errorf("resource row: holder %s fence %d, want %s fence %d", h, f, holder, fence)
	}
}
