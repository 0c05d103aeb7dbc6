package main

import (
	"context"
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
