package integration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// setup gives a test its own migrated database: its URL, and a cleanup
// (registered first, so it runs after every pool and worker of the test has
// gone) that fails the test if any advisory lock is left in that database.
func setup(t *testing.T) string {
	t.Helper()
	u := pgtest.URL(t)
	assertNoAdvisoryLocks(t, u)
	return u
}

// newPool opens a pool over u whose sessions carry application_name app,
// so that a test can find (and terminate) exactly their backends. Options
// may adjust the configuration. At cleanup it asserts that no connection is
// still acquired (every Lock, Lease and transaction gave its connection
// back), then closes the pool.
func newPool(t *testing.T, u, app string, opts ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatalf("parse %s: %v", u, err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	for _, o := range opts {
		o(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(func() {
		defer pool.Close()
		if n := pgtest.Acquired(pool); n != 0 {
			t.Errorf("pool %s: %d connections still acquired at the end of the test", app, n)
		}
	})
	return pool
}

// assertNoAdvisoryLocks registers a cleanup that fails t if an advisory lock
// is still held or awaited in u's database. Sessions of killed processes
// take a moment to end, so it waits up to 5s for the count to reach zero.
func assertNoAdvisoryLocks(t *testing.T, u string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Errorf("assertNoAdvisoryLocks: connect: %v", err)
			return
		}
		defer conn.Close(context.Background())
		var n int
		err = waitFor(ctx, 5*time.Second, func() (bool, error) {
			err := conn.QueryRow(ctx, sqlCountAdvisoryLocks).Scan(&n)
			return n == 0, err
		})
		if err != nil {
			t.Errorf("advisory locks left in the test database: %d (%v)", n, err)
		}
	})
}

// sqlCountAdvisoryLocks counts the advisory locks (held or awaited) of the
// current database; other tests' databases have their own.
const sqlCountAdvisoryLocks = `
SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory'
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// waitFor polls cond every 10ms until it reports true, returns an error, or
// timeout passes. It is for conditions that only the database can tell
// (there is no event to await); timeout is generous on purpose.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil && ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
			}
			return fmt.Errorf("condition not met within %v: %w", timeout, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// mustWait is waitFor that fails t.
func mustWait(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	if err := waitFor(context.Background(), timeout, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// mustExec runs one statement on pool, failing t on error.
func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pool.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// protectedTable creates a table named name with a bigint fence column and
// installs the fence guard on it with fencing.Protect.
func protectedTable(t *testing.T, pool *pgxpool.Pool, name, columns string) {
	t.Helper()
	mustExec(t, pool, "CREATE TABLE "+pgx.Identifier{name}.Sanitize()+" ("+columns+", fence bigint NOT NULL DEFAULT 0)")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fencing.Protect(ctx, pool, name); err != nil {
		t.Fatalf("protect %s: %v", name, err)
	}
}

// leaseRow is a lease's row as the database sees it, with the database's
// clock at the moment of reading.
type leaseRow struct {
	Owner      string
	Fence      int64
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
	Now        time.Time
}

// live reports whether the grant was unexpired when read.
func (r leaseRow) live() bool { return r.ExpiresAt.After(r.Now) }

// readLease reads lease name's row; ok is false when there is none.
func readLease(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) (row leaseRow, ok bool, err error) {
	err = db.QueryRow(ctx, `SELECT owner, fence, acquired_at, renewed_at, expires_at, clock_timestamp()
	                          FROM pgfence.leases WHERE name = $1`, name).
		Scan(&row.Owner, &row.Fence, &row.AcquiredAt, &row.RenewedAt, &row.ExpiresAt, &row.Now)
	if errors.Is(err, pgx.ErrNoRows) {
		return row, false, nil
	}
	return row, err == nil, err
}

// ctxT returns a context bounded by d, cancelled at the end of the test.
func ctxT(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newLeases opens a leases client over pool with owner prefix owner,
// closed when t ends.
func newLeases(t *testing.T, pool *pgxpool.Pool, owner string, opts ...leases.Option) *leases.Client {
	t.Helper()
	c, err := leases.New(pool, append([]leases.Option{leases.WithOwner(owner)}, opts...)...)
	if err != nil {
		t.Fatalf("leases.New: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
