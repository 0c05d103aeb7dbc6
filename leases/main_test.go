package leases

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestMain provides DATABASE_URL to the Examples, which connect the way an
// application does. A helper process (process_test.go,
// handoverreq_test.go, waiters_bench_test.go) needs none.
func TestMain(m *testing.M) {
	for _, env := range []string{helperEnvURL, helperEnvHandoverURL, waitersEnvURL} {
		if os.Getenv(env) != "" {
			pgtest.Main(m)
		}
	}
	pgtest.MainWithURL(m, "DATABASE_URL")
}

// testTimeout bounds any single wait in the tests; generous because two
// shared CPU cores run several packages' tests with -race at once.
const testTimeout = 30 * time.Second

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// newClient returns a client over pool that is closed when t ends, and
// checks then that it left no connection acquired.
func newClient(t *testing.T, pool *pgxpool.Pool, opts ...Option) *Client {
	t.Helper()
	c, err := New(pool, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := pgtest.Acquired(pool); n != 0 {
			t.Errorf("after Close: %d connections still acquired from the pool", n)
		}
	})
	return c
}

// setup returns a client over a fresh migrated database, and its pool.
func setup(t *testing.T, opts ...Option) (*Client, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t)
	return newClient(t, pool, opts...), pool
}

// clients returns n clients, each over its own pool, on one fresh database
// (so that they share nothing in-process, as separate replicas would).
func clients(t *testing.T, n int, opts ...Option) ([]*Client, []*pgxpool.Pool) {
	t.Helper()
	url := pgtest.URL(t)
	cs := make([]*Client, n)
	ps := make([]*pgxpool.Pool, n)
	for i := range n {
		ps[i] = pgtest.PoolFor(t, url)
		cs[i] = newClient(t, ps[i], opts...)
	}
	return cs, ps
}

// freeze makes c, right after New, a frozen holder: its leases are never
// renewed and their rows are left in place when the local deadline passes.
func freeze(c *Client) *Client {
	c.hooks.noKeepalive = true
	return c
}

// hookWait has c, right after New, call f each time a waiting acquirer
// goes to sleep after a failed attempt.
func hookWait(c *Client, f func(name string)) *Client {
	c.hooks.onWait = f
	return c
}

// waitListening waits until c's listener has LISTENed once.
func waitListening(t *testing.T, c *Client) {
	t.Helper()
	c.startListener()
	select {
	case <-c.hooks.listening:
	case <-time.After(testTimeout):
		t.Fatal("listener did not start")
	}
}

// pgtestPoolEmpty returns a pool over a database without pgfence's schema.
func pgtestPoolEmpty(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolFor(t, pgtest.EmptyURL(t))
}
