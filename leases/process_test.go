package leases

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

const (
	helperEnvURL  = "PGFENCE_LEASES_HELPER_URL"
	helperEnvName = "PGFENCE_LEASES_HELPER_NAME"
	helperRounds  = 5
)

// Several OS processes (this test binary re-executed) contend for one
// lease; each records, by the database clock, when it held it. The
// intervals, in fence order, never overlap.
func TestExclusiveAcrossProcesses(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE holds (fence bigint PRIMARY KEY, pid int NOT NULL,
		t0 timestamptz NOT NULL DEFAULT clock_timestamp(), t1 timestamptz)`); err != nil {
		t.Fatal(err)
	}
	const procs = 3
	cmds := make([]*exec.Cmd, procs)
	// Each helper's output goes into the failure it explains: written to
	// this process's stderr, it landed among other tests' output, and a
	// helper that exited 1 in CI left nothing to read.
	outs := make([]bytes.Buffer, procs)
	for i := range cmds {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), helperEnvURL+"="+url, helperEnvName+"=procs")
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper process %d: %v\n%s", i, err, outs[i].String())
		}
	}
	rows, err := pool.Query(ctx, "SELECT fence, pid, t0, t1 FROM holds ORDER BY fence")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var n int
	pids := map[int]bool{}
	var prevEnd time.Time
	for rows.Next() {
		var fence int64
		var pid int
		var t0 time.Time
		var t1 *time.Time
		if err := rows.Scan(&fence, &pid, &t0, &t1); err != nil {
			t.Fatal(err)
		}
		n++
		pids[pid] = true
		if t1 == nil {
			t.Errorf("fence %d: hold never ended", fence)
			continue
		}
		if t0.Before(prevEnd) {
			t.Errorf("fence %d (pid %d) held from %s, before the previous holder let go at %s", fence, pid, t0, prevEnd)
		}
		prevEnd = *t1
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != procs*helperRounds || len(pids) != procs {
		t.Errorf("%d holds by %d processes, want %d by %d", n, len(pids), procs*helperRounds, procs)
	}
}

// TestHelperProcess is the body of TestExclusiveAcrossProcesses's child
// processes; run directly, it does nothing.
func TestHelperProcess(t *testing.T) {
	url := os.Getenv(helperEnvURL)
	if url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := New(pool, WithOwner(fmt.Sprintf("pid%d", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range helperRounds {
		err := c.Run(ctx, os.Getenv(helperEnvName), 5*time.Second, func(ctx context.Context, l *Lease) error {
			if _, err := pool.Exec(ctx, "INSERT INTO holds (fence, pid) VALUES ($1, $2)", l.Fence(), os.Getpid()); err != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond) // hold it a moment: widen any overlap
			_, err := pool.Exec(ctx, "UPDATE holds SET t1 = clock_timestamp() WHERE fence = $1", l.Fence())
			return err
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
