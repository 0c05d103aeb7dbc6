package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestXactLockReleasedAtCommitAndRollback(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)

	for _, end := range []string{"commit", "rollback"} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := XactLock(ctx, tx, "xact"); err != nil {
			t.Fatalf("XactLock: %v", err)
		}
		if _, err := l.TryLock(ctx, "xact"); !errors.Is(err, ErrLocked) {
			t.Errorf("session TryLock while a transaction holds the name = %v, want ErrLocked", err)
		}
		other, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := TryXactLock(ctx, other, "xact"); err != nil || ok {
			t.Errorf("TryXactLock in another transaction = %v, %v; want false, nil", ok, err)
		}
		if err := other.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if end == "commit" {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		lk, err := l.TryLock(ctx, "xact")
		if err != nil {
			t.Fatalf("TryLock after %s: %v (the transaction lock must be gone)", end, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks = %d, want 0", n)
	}
	assertIdle(t, pool)
}

// A session lock held by pglock keeps transaction locks on the same name
// out, and a waiting XactLock gets in when the session lock is released.
func TestSessionLockExcludesXactLock(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)

	lk, err := l.Lock(ctx, "mixed")
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if ok, err := TryXactLock(ctx, tx, "mixed"); err != nil || ok {
		t.Fatalf("TryXactLock while a session holds the name = %v, %v; want false, nil", ok, err)
	}
	got := make(chan error, 1)
	go func() { got <- XactLock(ctx, tx, "mixed") }()
	pgtest.WaitFor(t, 10*1e9, "XactLock to wait", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND`+inThisDB).Scan(&n)
		return n == 1
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("XactLock after the session lock was released: %v", err)
	}
	if _, err := l.TryLock(ctx, "mixed"); !errors.Is(err, ErrLocked) {
		t.Errorf("TryLock while the transaction holds it = %v, want ErrLocked", err)
	}
}

// A cancelled XactLock fails with the context's error.
func TestXactLockHonoursContext(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	lk, err := l.Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	wctx, cancel := context.WithTimeout(ctx, 100*1e6)
	defer cancel()
	if err := XactLock(wctx, tx, "held"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("XactLock with an expiring context = %v, want context.DeadlineExceeded", err)
	}
}

// xactLocks are the blocking transaction-lock calls, given names:
// XactLockAll takes them all, XactLock the last.
var xactLocks = []struct {
	name string
	lock func(ctx context.Context, tx pgx.Tx, names ...string) error
}{
	{"XactLock", func(ctx context.Context, tx pgx.Tx, names ...string) error {
		return XactLock(ctx, tx, names[len(names)-1])
	}},
	{"XactLockAll", XactLockAll},
}

// behindHolder holds the lock "held" from observer, a pool of its own, and
// begins tx on conn, which reaches the server through a proxy that now
// refuses new connections: a cancel request for conn is lost. opts adjust
// conn's pool. The lock, conn and tx are given back when t ends.
func behindHolder(t *testing.T, opts ...func(*pgxpool.Config)) (observer *pgxpool.Pool, conn *pgxpool.Conn, tx pgx.Tx) {
	t.Helper()
	url := pgtest.URL(t)
	observer = newPool(t, url, 2)
	ctx := testContext(t)
	lk, err := newLocker(t, observer).Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Unlock(context.Background()) })

	px := proxyTo(t, observer)
	pool := pgtest.PoolFor(t, url, append([]func(*pgxpool.Config){px.route}, opts...)...)
	conn, err = pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	tx, err = conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	px.RefuseNew()
	return observer, conn, tx
}

// An XactLock whose context's deadline passes while it waits, and whose
// cancel request is lost (the proxy refuses new connections; pgx sends
// the request on one when the deadline closes the connection), leaves no
// backend waiting: the deadline travels as the statement's lock_timeout.
// Before, the backend stayed queued behind the holder until the holder let
// go. Also for XactLockAll.
func TestXactLockDeadlineWithCancelLost(t *testing.T) {
	t.Parallel()
	for _, call := range xactLocks {
		t.Run(call.name, func(t *testing.T) {
			t.Parallel()
			observer, _, tx := behindHolder(t)
			wctx, cancel := context.WithTimeout(testContext(t), 500*time.Millisecond)
			defer cancel()
			if err := call.lock(wctx, tx, "free", "held"); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s past its deadline = %v, want context.DeadlineExceeded", call.name, err)
			}
			pgtest.WaitFor(t, 2*time.Second, "no backend waiting for the lock", func() bool { return waiters(t, observer) == 0 })
		})
	}
}

// A backend waiting for a lock reads nothing from its client, so the wait
// of an XactLock whose context ends without a deadline, and whose cancel
// request is lost, stays queued behind the holder, delaying those queued
// after it, until the lock is granted. The server's
// client_connection_check_interval (docs/production.md, "Session
// settings") ends it once the connection is closed: at once where the
// client is gone (a killed process closes its sockets), and where pgx
// gave up on the statement, after pgx has drained the connection for up
// to 15s. Without the setting all four subtests fail: the backend waits
// until the test's end.
func TestXactLockClientGoneEndsWait(t *testing.T) {
	t.Parallel()
	abandons := []struct {
		name    string
		within  time.Duration // generous: the interval is 1s
		abandon func(cancel context.CancelFunc, conn *pgxpool.Conn)
	}{
		{"client gone", 5 * time.Second, func(_ context.CancelFunc, conn *pgxpool.Conn) {
			_ = conn.Conn().PgConn().Conn().Close()
		}},
		{"cancel lost", 15*time.Second + 10*time.Second, func(cancel context.CancelFunc, _ *pgxpool.Conn) {
			cancel()
		}},
	}
	for _, call := range xactLocks {
		for _, a := range abandons {
			t.Run(call.name+"/"+a.name, func(t *testing.T) {
				t.Parallel()
				observer, conn, tx := behindHolder(t, func(cfg *pgxpool.Config) {
					cfg.ConnConfig.RuntimeParams["client_connection_check_interval"] = "1s"
				})
				pg := conn.Conn().PgConn()
				wctx, cancel := context.WithCancel(testContext(t))
				defer cancel()
				done := make(chan error, 1)
				go func() { done <- call.lock(wctx, tx, "free", "held") }()
				pgtest.WaitFor(t, 10*time.Second, "the call waiting for the lock", func() bool { return waiters(t, observer) == 1 })
				a.abandon(cancel, conn)
				if err := <-done; err == nil {
					t.Fatalf("%s returned nil after its connection was abandoned", call.name)
				}
				pgtest.WaitFor(t, a.within, "no backend waiting for the lock", func() bool { return waiters(t, observer) == 0 })
				select { // pgx's drain has ended: no goroutine outlives the test
				case <-pg.CleanupDone():
				case <-time.After(20 * time.Second):
					t.Errorf("pgx's clean-up of the abandoned connection has not ended")
				}
			})
		}
	}
}

// An XactLock with a deadline leaves the transaction's lock_timeout as it
// was: the deadline is the statement's own.
func TestXactLockKeepsLockTimeout(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t)
	ctx := testContext(t)
	for _, call := range xactLocks {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = call.lock(wctx, tx, "a", "b")
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", call.name, err)
		}
		var got string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "7s" {
			t.Errorf("after %s with a deadline, lock_timeout = %q, want the transaction's 7s", call.name, got)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
