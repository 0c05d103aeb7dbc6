package leases

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promise (docs/design.md, "Durability of each statement"): a grant, a
// renewal and a force-release commit durably; a release — Release, and
// the batch release of Close — commits asynchronously, with
// synchronous_commit off for that transaction only, unless
// WithDurableRelease, with which it commits as the session says.
//
// A commit that is durable under synchronous replication waits for the
// synchronous standby (wait_event SyncRep); an asynchronous one does not.
// On a cluster whose synchronous standby never connects (standbyDown),
// each statement is therefore either seen waiting in SyncRep — then the
// test lets it through with pg_cancel_backend, which ends the wait of a
// commit that has already happened locally, and the call succeeds — or
// returns without ever waiting there.

// syncRepBackend returns the pid of a backend whose commit waits for the
// synchronous standby while it runs a statement containing fn, or 0.
func syncRepBackend(t *testing.T, ctx context.Context, admin *pgxpool.Pool, fn string) int {
	t.Helper()
	var pid int
	err := admin.QueryRow(ctx, `SELECT coalesce(min(pid), 0) FROM pg_stat_activity
 WHERE wait_event = 'SyncRep' AND strpos(query, $1) > 0`, fn).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// commitWaits runs call, and checks that its statement containing fn
// waits for the synchronous standby: it awaits that wait, lets it through,
// and returns call's error.
func commitWaits(t *testing.T, ctx context.Context, admin *pgxpool.Pool, what, fn string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	for {
		select {
		case err := <-done:
			t.Errorf("%s returned (%v) without its commit (%s) waiting for the synchronous standby: not durable", what, err, fn)
			return err
		case <-ctx.Done():
			t.Fatalf("%s: neither returned nor waited for the synchronous standby", what)
		case <-time.After(10 * time.Millisecond): // polling: no event announces a wait in pg_stat_activity
		}
		if pid := syncRepBackend(t, ctx, admin, fn); pid != 0 {
			if _, err := admin.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				return err
			case <-ctx.Done():
				t.Fatalf("%s did not return once let through", what)
			}
		}
	}
}

// commitDoesNotWait runs call and checks that it returns without its
// statement containing fn ever waiting for the synchronous standby.
func commitDoesNotWait(t *testing.T, ctx context.Context, admin *pgxpool.Pool, what, fn string, call func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- call() }()
	for {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			t.Fatalf("%s did not return", what)
		case <-time.After(10 * time.Millisecond): // polling, as in commitWaits
		}
		if pid := syncRepBackend(t, ctx, admin, fn); pid != 0 {
			t.Errorf("%s: its commit (%s) waits for the synchronous standby: want an asynchronous commit", what, fn)
			if _, err := admin.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			return <-done
		}
	}
}

func TestReleaseCommitsAsynchronouslyUnlessDurable(t *testing.T) {
	url, admin, ctx := standbyDown(t)
	// One connection, so that the session a release ran on is the one
	// asked about afterwards. The TTL keeps the keepalive away.
	const ttl = time.Minute
	pool := pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	c := newClient(t, pool)

	var l *Lease
	err := commitWaits(t, ctx, admin, "TryAcquire", "try_acquire", func() (err error) {
		l, err = c.TryAcquire(ctx, "durability/a", ttl)
		return err
	})
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := commitWaits(t, ctx, admin, "Renew", "pgfence.renew", func() error { return l.Renew(ctx) }); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := commitDoesNotWait(t, ctx, admin, "Release", "pgfence.release", func() error { return l.Release(ctx) }); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// For that transaction only: the session commits durably again.
	var setting string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "on" {
		t.Errorf("after Release, the session's synchronous_commit is %q, want on", setting)
	}

	// Close's batch release, asynchronous too.
	c2 := newClient(t, pgtest.PoolFor(t, url))
	if err := commitWaits(t, ctx, admin, "TryAcquire", "try_acquire", func() (err error) {
		_, err = c2.TryAcquire(ctx, "durability/b", ttl)
		return err
	}); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if err := commitDoesNotWait(t, ctx, admin, "Close", "pgfence.release_many", c2.Close); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// WithDurableRelease: Release and Close wait as a grant does.
	d := newClient(t, pgtest.PoolFor(t, url), WithDurableRelease(true))
	for _, name := range []string{"durability/c", "durability/d"} {
		if err := commitWaits(t, ctx, admin, "TryAcquire", "try_acquire", func() (err error) {
			l, err = d.TryAcquire(ctx, name, ttl)
			return err
		}); err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
	}
	if err := commitWaits(t, ctx, admin, "durable Release", "pgfence.release", func() error { return l.Release(ctx) }); err != nil {
		t.Fatalf("durable Release: %v", err)
	}
	if err := commitWaits(t, ctx, admin, "durable Close", "pgfence.release_many", d.Close); err != nil {
		t.Fatalf("durable Close: %v", err)
	}

	// A force-release: durable, the operator acts on its answer.
	if err := commitWaits(t, ctx, admin, "TryAcquire", "try_acquire", func() (err error) {
		_, err = c.TryAcquire(ctx, "durability/e", ttl)
		return err
	}); err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	op := newClient(t, pgtest.PoolFor(t, url))
	if err := commitWaits(t, ctx, admin, "ForceRelease", "pgfence.force_release", func() error {
		return op.ForceRelease(ctx, "durability/e")
	}); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
}
