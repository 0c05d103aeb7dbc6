package integration_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestFencesAfterRestore (scenario: reissued after a restore inside the
// same cluster): pg_dump, more grants, drop, pg_restore. The grant made
// after the dump is lost with the restore; the next grant of that lease
// must not hand out its fence again, and the lost grant's holder must not
// write. Migration 3 reissued the fence here (the sequence came back with
// the dump and the epoch had not changed).
func TestFencesAfterRestore(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t)
	ctx := ctxT(t, 2*time.Minute)
	u := c.URL("postgres")
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	pool := newPool(t, u, "restore")
	protectedTable(t, pool, "resource", "id int PRIMARY KEY, holder text NOT NULL")
	lc := newLeases(t, pool, "restore")

	a, err := lc.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	writeResource(t, pool, a.Token(), "a")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(t.TempDir(), "db.dump")
	runTool(t, c, "pg_dump", "-Fc", "-f", dump, "-d", u)

	// After the dump: b is granted (a higher fence) and writes; all of it
	// is lost with the restore.
	b, err := lc.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	writeResource(t, pool, b.Token(), "b")
	lostToken := b.Token()

	pool.Reset() // the drop needs no sessions of ours in the objects
	mustExec(t, pool, `DROP TABLE resource`)
	mustExec(t, pool, `DROP SCHEMA pgfence CASCADE`)
	mustExec(t, pool, `DROP TABLE pgfence_schema_migrations`)
	runTool(t, c, "pg_restore", "-d", u, dump)

	// The next grant of the lease exceeds every fence issued before the
	// restore, including the lost one.
	other := newLeases(t, newPool(t, u, "after-restore"), "after")
	cur, err := other.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if cur.Fence() <= lostToken.Fence {
		t.Fatalf("fence %d granted after the restore; fence %d was issued before it (lost with the restore): reissued", cur.Fence(), lostToken.Fence)
	}
	err = fencing.InTx(ctx, pool, lostToken, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE resource SET holder = 'b-stale' WHERE id = 1`)
		return err
	})
	if !fencing.IsStale(err) {
		t.Fatalf("the lost grant's write after the restore: %v, want stale", err)
	}
	writeResource(t, pool, cur.Token(), "after")
	assertResource(t, pool, "after", cur.Fence())
	t.Logf("fences: before dump %d, lost %d, after restore %d", a.Fence(), lostToken.Fence, cur.Fence())
}

// TestFencesAfterRollback: a volume snapshot rolled back (the data
// directory copied while the server was stopped, and copied back after
// more grants) — the same system identifier, timeline and objects; only
// time has moved on. The next grant still exceeds the lost one.
func TestFencesAfterRollback(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t)
	ctx := ctxT(t, 2*time.Minute)
	u := c.URL("postgres")
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	grant := func(name string) int64 {
		t.Helper()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var f int64
		if err := conn.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire($1, 'x', 1000000) WHERE granted`, name).Scan(&f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	grant("job")
	snapshot := filepath.Join(t.TempDir(), "snapshot")
	if err := c.Stop("fast"); err != nil {
		t.Fatal(err)
	}
	copyDir(t, c.DataDir(), snapshot)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	lost := grantOnceFree(ctx, t, u, "y")
	if err := c.Stop("immediate"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.DataDir()); err != nil {
		t.Fatal(err)
	}
	copyDir(t, snapshot, c.DataDir())
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	after := grantOnceFree(ctx, t, u, "z")
	if after <= lost {
		t.Fatalf("fence %d after the rollback; %d was issued before it and lost: reissued", after, lost)
	}
}

// grantOnceFree waits until lease "job" is free at u (its 1s grant has
// expired, by the database clock) and grants it to owner for a minute,
// returning the fence. It polls a condition of the server that no channel
// can signal.
func grantOnceFree(ctx context.Context, t *testing.T, u, owner string) int64 {
	t.Helper()
	var fence int64
	pgtest.WaitFor(t, 30*time.Second, "the 1s grant of job to expire", func() bool {
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			return false
		}
		defer conn.Close(ctx)
		err = conn.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', $1, 60000000) WHERE granted`, owner).Scan(&fence)
		return err == nil
	})
	return fence
}

// runTool runs one of the cluster's client programs, failing t on error.
func runTool(t *testing.T, c *pgtest.Cluster, name string, args ...string) {
	t.Helper()
	path, err := c.Tool(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// copyDir copies a data directory with its owner and modes (cp -a).
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	if out, err := exec.Command("cp", "-a", from, to).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s %s: %v\n%s", from, to, err, out)
	}
}
