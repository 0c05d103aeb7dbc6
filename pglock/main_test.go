package pglock

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestMain provides DATABASE_URL to the Examples, which connect the way an
// application does. A helper process (process_test.go) needs none.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		pgtest.Main(m)
	}
	pgtest.MainWithURL(m, "DATABASE_URL")
}

// newPool opens a pool of at most maxConns connections over databaseURL,
// closed when t ends (pgtest.PoolFor also checks then that none is still
// acquired).
func newPool(t testing.TB, databaseURL string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolFor(t, databaseURL, func(c *pgxpool.Config) { c.MaxConns = maxConns })
}

// setup returns a pool over a fresh migrated database and a Locker over it.
func setup(t testing.TB, opts ...Option) (*pgxpool.Pool, *Locker) {
	t.Helper()
	pool := newPool(t, pgtest.URL(t), 8)
	return pool, newLocker(t, pool, opts...)
}

// newLocker is New, failing t on an error.
func newLocker(t testing.TB, pool *pgxpool.Pool, opts ...Option) *Locker {
	t.Helper()
	l, err := New(pool, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return l
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// inThisDB restricts a pg_locks query to the test's own database: other
// tests and other test processes share the server.
const inThisDB = ` database = (SELECT oid FROM pg_database WHERE datname = current_database()) `

// advisoryLocks counts advisory locks, granted or awaited, in the pool's
// database, whoever holds them.
func advisoryLocks(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND`+inThisDB).Scan(&n)
	if err != nil {
		t.Fatalf("count advisory locks: %v", err)
	}
	return n
}

// backendAlive reports whether backend pid still exists.
func backendAlive(t testing.TB, pool *pgxpool.Pool, pid uint32) bool {
	t.Helper()
	var alive bool
	err := pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&alive)
	if err != nil {
		t.Fatalf("look up backend %d: %v", pid, err)
	}
	return alive
}

// assertIdle checks that no connection of pool is checked out.
func assertIdle(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	if n := pgtest.Acquired(pool); n != 0 {
		t.Errorf("pool has %d acquired connections, want 0", n)
	}
}

// poolPIDs returns the backend pids of the pool's idle connections.
func poolPIDs(t testing.TB, pool *pgxpool.Pool) map[uint32]bool {
	t.Helper()
	pids := map[uint32]bool{}
	for _, c := range pool.AcquireAllIdle(context.Background()) {
		pids[c.Conn().PgConn().PID()] = true
		c.Release()
	}
	return pids
}
