//go:build linux

package pgfencetest

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The promises of the package doc: URL and Pool give a test its own
// database and drop it when the test ends; a fault is undone when the test
// ends, also when it fails. Each test here runs a "test" through recorder
// that fails with Fatalf after setting things up, then checks what its
// cleanups left.

// TestDatabaseDroppedWhenTestFails: the databases of URL and Pool are
// dropped when their test ends by Fatalf — a connection the test left open
// included — and the pool is closed.
func TestDatabaseDroppedWhenTestFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var names []string
	var left *pgx.Conn
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) {
		u := URL(tb)
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			t.Error(err)
			return
		}
		names = append(names, cfg.Database)
		if left, err = pgx.Connect(ctx, u); err != nil { // left open
			t.Error(err)
			return
		}
		pool := Pool(tb)
		names = append(names, pool.Config().ConnConfig.Database)
		tb.Fatalf("the test fails")
	})
	if left != nil {
		defer left.Close(context.Background())
	}
	if r.fatal != "the test fails" || len(r.errors) != 0 {
		t.Fatalf("the test ended with %q, errors %q; want only its own Fatalf", r.fatal, r.errors)
	}
	if len(names) != 2 {
		t.Fatalf("databases %q: want URL's and Pool's", names)
	}
	conn, err := pgx.Connect(ctx, URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, name := range names {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("database %s still exists after its test ended", name)
		}
	}
}

// procState returns the state letter of process pid (R, S, T for
// stopped, ...), from /proc.
func procState(t testing.TB, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return fields[0]
}

// TestPauseProcessUndoneWhenTestFails: a process paused by a test that
// then fails without resuming it runs again once the test has ended.
func TestPauseProcessUndoneWhenTestFails(t *testing.T) {
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := cmd.Process.Pid
	r := &recorder{TB: t}
	r.run(func(tb testing.TB) {
		PauseProcess(tb, cmd.Process)
		awaitState(tb, pid, "stopped after PauseProcess", func(s string) bool { return s == "T" })
		tb.Fatalf("the test fails")
	})
	if r.fatal != "the test fails" || len(r.errors) != 0 {
		t.Fatalf("the test ended with %q, errors %q; want only its own Fatalf", r.fatal, r.errors)
	}
	awaitState(t, pid, "running again after the test that paused it ended", func(s string) bool { return s != "T" })
}

// awaitState waits until the state of process pid satisfies ok: a signal
// takes effect when the process is next scheduled, and /proc announces
// nothing, so it polls, for at most 10s (two loaded cores).
func awaitState(t testing.TB, pid int, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s := procState(t, pid); !ok(s); s = procState(t, pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d is in state %s, not %s", pid, s, what)
		}
		time.Sleep(10 * time.Millisecond) // polling: /proc announces nothing
	}
}
