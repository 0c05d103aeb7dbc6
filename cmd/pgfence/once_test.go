package main

import (
	"context"
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
