package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// The pieces run calls for --once and --at-least: a period recorded by one
// holder is skipped by the next; a stale holder cannot record; --at-least
// keeps the lease after release.
func TestOnceOptions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := pgtest.PoolFor(t, pgtest.URL(t))
	lc, err := leases.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()

	var o onceOptions
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	addOnceFlags(fs, &o)
	if err := fs.Parse([]string{"--once", "2026-12-01", "--at-least", "30s"}); err != nil {
		t.Fatal(err)
	}
	if err := o.validate(""); err == nil {
		t.Error("validate without --lease succeeded")
	}
	if err := (onceOptions{atLeast: -time.Second}).validate("job"); err == nil {
		t.Error("validate with a negative --at-least succeeded")
	}
	if err := o.validate("job"); err != nil {
		t.Fatal(err)
	}

	l, err := lc.Acquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if skip, err := o.skip(ctx, lc, l); skip || err != nil {
		t.Fatalf("skip before the record = %v, %v", skip, err)
	}
	if err := o.record(ctx, pool, l); err != nil {
		t.Fatalf("record: %v", err)
	}
	if err := o.hold(l); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := lc.TryAcquire(ctx, "job", time.Minute); err == nil {
		t.Error("lease free right after a release with --at-least 30s")
	}
	if err := lc.ForceRelease(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	next, err := lc.Acquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if skip, err := o.skip(ctx, lc, next); !skip || err != nil {
		t.Errorf("skip after the record = %v, %v; want true", skip, err)
	}
	if err := o.record(ctx, pool, l); !fencing.IsStale(err) {
		t.Errorf("record by the former holder = %v, want stale", err)
	}
}

// pgfence run --once KEY runs the command for a period once: a second run
// for the same period exits 0 without running it; a failing command
// leaves the period undone; --at-least keeps the lease after the command.
func TestRunOnce(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	marker := t.TempDir() + "/ran"
	run := func(key string, cmdline string, extra ...string) result {
		args := append([]string{"run", "--lease", "once/job", "--ttl", "5s", "--once", key}, extra...)
		return db(t, url, append(args, "--", "sh", "-c", cmdline)...)
	}
	if r := run("p1", "exit 3"); r.code != 3 {
		t.Fatalf("failing command: exit %d, want 3", r.code)
	}
	if r := run("p1", "echo x >> "+marker); r.code != 0 {
		t.Fatalf("first successful run: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := run("p1", "echo x >> "+marker); r.code != 0 || !strings.Contains(r.stderr, "already done") {
		t.Fatalf("second run of a done period: exit %d, stderr %q; want 0 and 'already done'", r.code, r.stderr)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "x\n" {
		t.Fatalf("the command ran %q times for one period (%v), want once", b, err)
	}
	// A minute, not a few seconds: the next run is a new process, which
	// took more than 3s to start and connect under -race on a loaded CI
	// machine (the lease was free by then).
	if r := run("p2", "true", "--at-least", "1m"); r.code != 0 {
		t.Fatalf("--at-least run: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := db(t, url, "run", "--lease", "once/job", "--ttl", "5s", "--no-wait", "--", "true"); r.code != exitHeld {
		t.Fatalf("right after an --at-least 1m run the lease was free (exit %d), want held (%d)", r.code, exitHeld)
	}
}
