package pgfencetest

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Environment variables that choose the server (see the package doc).
const (
	EnvURL         = pgtest.EnvURL         // PGFENCE_TEST_DATABASE_URL
	EnvImage       = pgtest.EnvImage       // PGFENCE_POSTGRES_IMAGE
	EnvProvisioner = pgtest.EnvProvisioner // PGFENCE_TEST_PROVISIONER
)

// Main runs the tests, stops the server this test binary provisioned, and
// fails the run if goroutines leaked (go.uber.org/goleak; opts tune it).
// Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgfencetest.Main(m) }
func Main(m *testing.M, opts ...goleak.Option) { pgtest.Main(m, opts...) }

// URL returns the connection URL of a new database with pgfence's
// migrations applied, which belongs to t and is dropped when t ends. The
// first call of a test binary provisions the server (see the package doc);
// it fails t when none can be had.
func URL(t testing.TB) string {
	t.Helper()
	return pgtest.URL(t)
}

// Pool returns a pool over a new migrated database (see URL). When t ends
// it fails t if a connection is still acquired, and closes the pool.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t)
}

// Source says where the test binary's server came from, for test logs:
// "PGFENCE_TEST_DATABASE_URL", "a container (postgres:17-alpine, Docker Engine API)",
// "local binaries (/usr/lib/postgresql/15/bin)".
func Source(t testing.TB) string {
	t.Helper()
	return pgtest.Source(t)
}
