package leases

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestForceReleaseFrozenHolder (scenario: break-glass behind a frozen
// holder). The holder is inside an open fenced transaction — its lease row
// share-locked — and never commits. ForceRelease returns within its bound
// with a *BlockedError naming the holder's backend; once that backend is
// ended, it succeeds and the lease can be granted again.
func TestForceReleaseFrozenHolder(t *testing.T) {
	t.Parallel()
	url, pool, ctx := protectedWork(t)
	holder := newClient(t, pool)
	l, err := holder.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	frozen := namedConn(t, ctx, url, "frozen-holder")
	frozenPID := int64(frozen.Conn().PgConn().PID())
	openFencedWrite(t, ctx, frozen, l) // its COMMIT never comes

	// The admin's pool: ample, and a single connection, on which the
	// blocker watcher cannot look while the force-release waits (as when
	// its connection comes late on a loaded machine); the holder is named
	// all the same.
	onePool := pgtest.PoolFor(t, url, func(c *pgxpool.Config) { c.MaxConns = 1 })
	for _, p := range []*pgxpool.Pool{pool, onePool} {
		admin := newClient(t, p, WithForceReleaseTimeout(500*time.Millisecond))
		start := time.Now()
		err = admin.ForceRelease(ctx, "job")
		took := time.Since(start)
		var be *BlockedError
		if !errors.Is(err, ErrBlocked) || !errors.As(err, &be) {
			t.Fatalf("ForceRelease (pool of %d) behind a frozen holder = %v, want a *BlockedError", p.Config().MaxConns, err)
		}
		// Bound: the 500ms lock timeout plus a loaded machine's slack.
		if took > 10*time.Second {
			t.Errorf("ForceRelease took %v with a 500ms timeout", took)
		}
		if len(be.Blockers) != 1 || be.Blockers[0].PID != frozenPID || be.Blockers[0].Application != "frozen-holder" || be.Blockers[0].Since.IsZero() {
			t.Fatalf("pool of %d: blockers = %+v, want the frozen holder's backend %d (frozen-holder) with its transaction start", p.Config().MaxConns, be.Blockers, frozenPID)
		}
		t.Logf("ForceRelease (pool of %d) returned after %v: %v", p.Config().MaxConns, took.Round(time.Millisecond), err)
	}
	admin := newClient(t, pool)
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, frozenPID); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 30*time.Second, "the frozen backend to end", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, frozenPID).Scan(&n)
		return n == 0
	})
	if err := admin.ForceRelease(ctx, "job"); err != nil {
		t.Fatalf("ForceRelease after ending the blocker: %v", err)
	}
	if _, err := admin.TryAcquire(ctx, "job", time.Minute); err != nil {
		t.Fatalf("TryAcquire after the force-release: %v", err)
	}
}

// protectedWork returns the URL of a new database with a protected table
// "work", a pool over it and the test's context.
func protectedWork(t *testing.T) (string, *pgxpool.Pool, context.Context) {
	t.Helper()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0); SELECT pgfence.protect('work')`); err != nil {
		t.Fatal(err)
	}
	return url, pool, ctx
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// namedConn returns a connection to url, from a pool of its own whose
// sessions are named app (application_name); it is released when the test
// ends.
func namedConn(t *testing.T, ctx context.Context, url, app string) *pgxpool.Conn {
	t.Helper()
	pool := pgtest.PoolFor(t, url, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return conn
}

// openFencedWrite leaves a transaction open on conn that has written a row
// of "work" under l's token, and so holds l's fence lock until it ends.
func openFencedWrite(t *testing.T, ctx context.Context, conn *pgxpool.Conn, l *Lease) {
	t.Helper()
	if err := fencedWrite(ctx, conn, l); err != nil {
		t.Fatal(err)
	}
}

// fencedWrite is openFencedWrite, returning its error; the transaction is
// rolled back if the write fails.
func fencedWrite(ctx context.Context, conn *pgxpool.Conn, l *Lease) error {
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`BEGIN`, nil},
		{`SELECT pgfence.declare_token($1, $2)`, []any{l.Name(), l.Fence()}},
		{`INSERT INTO work VALUES (1)`, nil},
	} {
		if _, err := conn.Exec(ctx, q.sql, q.args...); err != nil {
			_, _ = conn.Exec(ctx, `ROLLBACK`)
			return fmt.Errorf("%s: %w", q.sql, err)
		}
	}
	return nil
}

// openExpiringFencedWrite grants "job" to c for a minute, opens a fenced
// write under it on conn (openFencedWrite), then shortens the grant to
// ttl: the grant expires with the write open. Granted for ttl itself, it
// could expire before the write on a loaded machine, and the write failed
// (PF001) instead: seen in a run of the package at -parallel 8, with
// MinTTL.
func openExpiringFencedWrite(t *testing.T, ctx context.Context, c *Client, conn *pgxpool.Conn, ttl time.Duration) *Lease {
	t.Helper()
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	openFencedWrite(t, ctx, conn, l)
	if err := l.Extend(ctx, ttl); err != nil {
		t.Fatalf("shorten the writer's grant to %s: %v", ttl, err)
	}
	return l
}

// TestForceReleaseBehindAFenceLockSquatter: any role may take any advisory
// lock, so a session that holds a lease's fence lock exclusively, without
// writing anything, stalls the lease's fenced writes and its force-release
// (docs/design.md, threat model). The force-release still returns within
// its bound and names that session.
func TestForceReleaseBehindAFenceLockSquatter(t *testing.T) {
	t.Parallel()
	url, pool, ctx := protectedWork(t)
	holder := newClient(t, pool)
	l, err := holder.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	squatter := namedConn(t, ctx, url, "squatter")
	if _, err := squatter.Exec(ctx, `SELECT pg_advisory_lock(1885824614, hashtext('job'))`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = squatter.Exec(ctx, `SELECT pg_advisory_unlock_all()`) })

	writer, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Release()
	_, err = writer.Exec(ctx, `SET lock_timeout = '200ms'; BEGIN; SELECT pgfence.declare_token('job', `+itoa(l.Fence())+`); INSERT INTO work VALUES (1)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("fenced write behind the squatter: %v, want lock_not_available (55P03)", err)
	}
	if _, err := writer.Exec(ctx, `ROLLBACK; RESET lock_timeout`); err != nil {
		t.Fatal(err)
	}

	admin := newClient(t, pool, WithForceReleaseTimeout(500*time.Millisecond))
	err = admin.ForceRelease(ctx, "job")
	var be *BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("ForceRelease behind the squatter = %v, want a *BlockedError", err)
	}
	if len(be.Blockers) != 1 || be.Blockers[0].PID != int64(squatter.Conn().PgConn().PID()) || be.Blockers[0].Application != "squatter" {
		t.Fatalf("blockers = %+v, want the squatter's backend %d", be.Blockers, squatter.Conn().PgConn().PID())
	}
}

// TestForceReleaseBlockersAreHolders (scenario: a lease's grant has
// expired while its holder's fenced transaction stays open, and another
// client's takeover waits for it, queued ahead of a force-release). The
// BlockedError names the open transaction's backend only: the waiting
// takeover, which pg_blocking_pids also lists, holds nothing, and ending
// it — as `pgfence leases release --terminate` ends the blockers — would
// only kill an innocent session.
func TestForceReleaseBlockersAreHolders(t *testing.T) {
	t.Parallel()
	url, pool, ctx := protectedWork(t)
	holder := namedConn(t, ctx, url, "holder")
	openExpiringFencedWrite(t, ctx, freeze(newClient(t, pool)), holder, MinTTL)
	pgtest.WaitFor(t, testTimeout, "the holder's grant to expire", func() bool {
		var expired bool
		err := pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = 'job'`).Scan(&expired)
		return err == nil && expired
	})
	taker := newClient(t, pool)
	took := make(chan error, 1)
	go func() {
		l, err := taker.TryAcquire(ctx, "job", time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		took <- err
	}()
	pgtest.WaitFor(t, testTimeout, "the takeover to wait for the fence lock", func() bool {
		return grantRunning(t, ctx, pool, "advisory") > 0
	})

	err := newClient(t, pool, WithForceReleaseTimeout(500*time.Millisecond)).ForceRelease(ctx, "job")
	var be *BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("ForceRelease behind the open fenced transaction = %v, want a *BlockedError", err)
	}
	if len(be.Blockers) != 1 || be.Blockers[0].PID != int64(holder.Conn().PgConn().PID()) {
		t.Errorf("blockers = %+v, want only the holder's backend %d", be.Blockers, holder.Conn().PgConn().PID())
	}
	if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-took; err != nil {
		t.Fatalf("the takeover: %v", err)
	}
}

// TestFenceHoldersNamesAnOpenFencedWriter: the query that names a
// force-release's blockers after its wait timed out reads the fence lock
// under the key the guard takes it with (hashtext since migration 9): an
// open fenced transaction is found, and nothing once it has ended.
func TestFenceHoldersNamesAnOpenFencedWriter(t *testing.T) {
	t.Parallel()
	url, pool, ctx := protectedWork(t)
	holder := newClient(t, pool)
	l, err := holder.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	writer := namedConn(t, ctx, url, "writer")
	openFencedWrite(t, ctx, writer, l)
	bs, err := queryBackends(ctx, pool, sqlFenceHolders, "job", int64(0))
	if err != nil || len(bs) != 1 || bs[0].PID != int64(writer.Conn().PgConn().PID()) || bs[0].Application != "writer" {
		t.Fatalf("fence-lock holders = %+v, %v; want the open writer %d", bs, err, writer.Conn().PgConn().PID())
	}
	if _, err := writer.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if bs, err := queryBackends(ctx, pool, sqlFenceHolders, "job", int64(0)); err != nil || len(bs) != 0 {
		t.Fatalf("fence-lock holders after COMMIT = %+v, %v; want none", bs, err)
	}
}

// TestRegrantLosesTheOldLease (scenario: an operator force-releases a
// lease, and the same client is granted it again before its keepalive's
// next renewal would learn of the force-release). The new grant proves the
// old one over: the old Lease is lost when the new one is returned — not
// left unrenewed until its local deadline, nor, if Close comes first,
// alive for ever — and the new one is the client's.
func TestRegrantLosesTheOldLease(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	// No listener: only a renewal, TTL/3 = 20s away, would tell c.
	c := newClient(t, pgtest.PoolFor(t, url), WithNotifications(false))
	admin := newClient(t, pgtest.PoolFor(t, url))
	ctx := testContext(t)
	old, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.ForceRelease(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-old.Done():
	default:
		t.Fatalf("the old lease (fence %d) is still held beside its new grant (fence %d)", old.Fence(), l.Fence())
	}
	if !errors.Is(old.Err(), ErrLost) {
		t.Errorf("old lease: %v, want ErrLost", old.Err())
	}
	if err := l.Err(); err != nil {
		t.Fatalf("new lease: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(l.Err(), ErrReleased) {
		t.Errorf("new lease after Close: %v, want ErrReleased", l.Err())
	}
}
