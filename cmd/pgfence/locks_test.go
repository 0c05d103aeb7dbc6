package main

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// advisoryWaiters counts the backends of the pool's database waiting for
// an advisory lock.
func advisoryWaiters(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		 WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()`).Scan(&n)
	if err != nil {
		t.Fatalf("count advisory waiters: %v", err)
	}
	return n
}

// `pgfence run --lock` interrupted while it waits exits 130 without running
// its command, and leaves no backend waiting for the lock: the process
// exits right after the wait is abandoned, so a cancel request sent in the
// background would die with it.
func TestRunLockInterruptedLeavesNoWaiter(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	env := cliEnv("DATABASE_URL=" + url)
	pool := pgtest.PoolFor(t, url)

	holder := startCLI(t, env, "run", "--lock", "interrupted", "--", "sh", "-c", "echo held; cat >/dev/null")
	t.Cleanup(func() { _ = holder.stdin.Close() }) // ends the holder's command, also on failure
	if l := holder.line(); l != "held" {
		t.Fatalf("holder printed %q", l)
	}
	const waiters = 6
	var ps []*proc
	for range waiters {
		ps = append(ps, startCLI(t, env, "run", "--lock", "interrupted", "--", "echo", "waiter ran"))
	}
	pgtest.WaitFor(t, cliTimeout, "the runs to wait for the lock", func() bool { return advisoryWaiters(t, pool) == waiters })
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
	}
	for _, p := range ps {
		if code := p.wait(); code != 128+int(syscall.SIGINT) {
			t.Errorf("interrupted run: exit %d, want %d", code, 128+int(syscall.SIGINT))
		}
	}
	start := time.Now()
	pgtest.WaitFor(t, time.Second, "no backend waiting for the lock", func() bool { return advisoryWaiters(t, pool) == 0 })
	t.Logf("no waiter left %v after the last interrupted run exited", time.Since(start))
	_ = holder.stdin.Close()
	if code := holder.wait(); code != 0 {
		t.Errorf("holder: exit %d", code)
	}
}

// A prepared transaction holding an advisory lock has no session (no pid in
// pg_locks). `locks ls` shows it by its GID and `check` names it as what a
// waiter waits for; before, both failed on the NULL pid, so one forgotten
// prepared transaction anywhere in the database broke the monitor.
func TestLocksPreparedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := preparedCluster(t)
	pool := pgtest.PoolFor(t, url)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`SELECT pg_advisory_xact_lock(pgfence.lock_key('nightly'))`, `PREPARE TRANSACTION 'xa-lock'`} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(ctx); err != nil { // the prepared transaction is on its own now
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `SELECT pg_advisory_xact_lock(pgfence.lock_key('nightly'))`)
		waited <- err
	}()
	pgtest.WaitFor(t, 30*time.Second, "the waiter to queue behind the prepared transaction", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
   AND waitstart < clock_timestamp() - interval '50 ms'
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return err == nil && n == 1
	})

	if r := db(t, url, "locks", "ls"); r.code != exitOK || !strings.Contains(r.stdout, `prepared transaction "xa-lock"`) {
		t.Errorf("locks ls: exit %d, stdout %q, stderr %q; want 0 and the prepared transaction", r.code, r.stdout, r.stderr)
	}
	r := db(t, url, "locks", "ls", "--json")
	var rows []lockRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("locks ls --json (exit %d): %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	var found bool
	for _, row := range rows {
		if row.GID == "xa-lock" {
			found = row.Granted && row.PID == 0 && row.SinceSource == "prepared" && row.Since != nil
		}
	}
	if !found {
		t.Errorf("locks ls --json: %+v, want xa-lock granted, pid 0, since when prepared", rows)
	}
	rep, code := checkJSON(t, url, "--max-hold", "1h", "--max-wait", "10ms")
	if code != exitFindings || len(rep.LockWaits) != 1 || len(rep.LockWaits[0].HeldBy) != 0 ||
		len(rep.LockWaits[0].Prepared) != 1 || rep.LockWaits[0].Prepared[0] != "xa-lock" {
		t.Errorf("check: exit %d, lock waits %+v; want 4 and one wait held by prepared transaction xa-lock", code, rep.LockWaits)
	}

	if _, err := pool.Exec(ctx, `ROLLBACK PREPARED 'xa-lock'`); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Errorf("the waiter after ROLLBACK PREPARED: %v", err)
	}
}
