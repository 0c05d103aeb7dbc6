package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/redact"
	"github.com/pgfence/pgfence/migrations"
)

// EnvURL names the environment variable that points the tests at an existing
// server. Its role needs CREATEDB; each test creates and drops its own
// database there.
const EnvURL = "PGFENCE_TEST_DATABASE_URL"

// server is the PostgreSQL server this test process uses for per-test
// databases.
type server struct {
	adminURL string       // a database on the server we may connect to
	source   string       // how it was provisioned, for messages
	stop     func() error // nil when we did not start it
}

var (
	srvOnce sync.Once
	srv     *server
	srvErr  error

	tplMu   sync.Mutex
	tplName string
)

// Main runs the package's tests, stops the server this process provisioned,
// and fails the run when goroutines leak. Call it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M, opts ...goleak.Option) {
	os.Exit(finish(m.Run(), opts))
}

// finish stops the server this process provisioned and, when the run
// passed (code 0), looks for leaked goroutines; it returns the exit code.
func finish(code int, opts []goleak.Option) int {
	if srv != nil {
		// One line per test binary, so that a CI log says which
		// provisioner served each package.
		fmt.Printf("pgtest: %s: PostgreSQL from %s\n", strings.TrimSuffix(filepath.Base(os.Args[0]), ".test"), srv.source)
	}
	if srv != nil && srv.stop != nil {
		if err := srv.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "pgtest: stop %s: %v\n", srv.source, err)
		}
	}
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines leaked after the tests: %v\n", err)
			code = 1
		}
	}
	return code
}

// Source says where this process's test server came from ("PGFENCE_TEST_DATABASE_URL",
// "testcontainers", "local binaries (/usr/lib/postgresql/15/bin)"). It
// provisions the server if no test has yet.
func Source(t testing.TB) string {
	t.Helper()
	return provision(t).source
}

func provision(t testing.TB) *server {
	t.Helper()
	srvOnce.Do(func() { srv, srvErr = provisionServer() })
	if srvErr != nil {
		t.Fatalf("pgtest: no PostgreSQL for the tests: %v\n\n%s", srvErr, howToProvide)
	}
	return srv
}

const howToProvide = `pgfence's tests need a real PostgreSQL (14 or newer). Provide one of:
  - PGFENCE_TEST_DATABASE_URL=postgres://user@host:5432/postgres (the role needs CREATEDB);
  - a running Docker engine (a postgres container is started, image PGFENCE_POSTGRES_IMAGE);
  - PostgreSQL server binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin,
    e.g. apt-get install -y postgresql.
bash .ci/run sets one of these up for you.`

// EnvProvisioner names the environment variable that forces one way of
// provisioning the server — "url" (EnvURL), "container" (a Docker
// container; "testcontainers" is accepted too) or "local" (binaries) —
// instead of trying them in order; the one named must work or the tests
// fail. CI uses it to run the suite through each.
const EnvProvisioner = "PGFENCE_TEST_PROVISIONER"

func provisionServer() (*server, error) {
	switch p := os.Getenv(EnvProvisioner); p {
	case "":
	case "url":
		return serverFromURL()
	case "local":
		return startLocal()
	default:
		if !isContainerProvisioner(p) {
			return nil, fmt.Errorf("%s=%q: want url, container or local", EnvProvisioner, p)
		}
		s, err := startContainer()
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvProvisioner, p, err)
		}
		return s, nil
	}
	if os.Getenv(EnvURL) != "" {
		return serverFromURL()
	}
	var reasons []string
	s, err := startContainer()
	if err == nil {
		return s, nil
	}
	reasons = append(reasons, "container: "+err.Error())
	if s, err = startLocal(); err == nil {
		return s, nil
	}
	reasons = append(reasons, "local binaries: "+err.Error())
	return nil, fmt.Errorf("%s unset; %s", EnvURL, strings.Join(reasons, "; "))
}

// serverFromURL is the existing server EnvURL points at.
func serverFromURL() (*server, error) {
	u := os.Getenv(EnvURL)
	if u == "" {
		return nil, fmt.Errorf("%s is not set", EnvURL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return nil, redact.ErrorFor(fmt.Errorf("%s is set but unusable: %w", EnvURL, err), u)
	}
	_ = conn.Close(ctx)
	return &server{adminURL: u, source: EnvURL}, nil
}

// startLocal starts a throwaway cluster from the machine's binaries.
func startLocal() (*server, error) {
	c, err := pgcluster.New()
	if err != nil {
		return nil, err
	}
	return &server{adminURL: c.URL("postgres"), source: "local binaries (" + c.BinDir() + ")", stop: c.Close}, nil
}

// URL returns the connection URL of a new database, cloned from a template
// with pgfence's migrations applied, that belongs to t and is dropped when t
// ends.
func URL(t testing.TB) string {
	t.Helper()
	s := provision(t)
	tpl, err := template(s)
	if err != nil {
		t.Fatalf("pgtest: migrated template: %v", err)
	}
	return newDatabase(t, s, tpl, "")
}

// EmptyURL returns the connection URL of a new, empty database (no pgfence
// schema) that belongs to t and is dropped when t ends. Migration tests use
// it.
func EmptyURL(t testing.TB) string {
	t.Helper()
	return newDatabase(t, provision(t), "template0", "")
}

// EmptyURLEncoded is EmptyURL for a database in encoding (LATIN1, say)
// with the C locale, which every encoding accepts: tests of what a
// database that is not UTF-8 does to names.
func EmptyURLEncoded(t testing.TB, encoding string) string {
	t.Helper()
	return newDatabase(t, provision(t), "template0",
		" ENCODING '"+strings.ReplaceAll(encoding, "'", "''")+"' LC_COLLATE 'C' LC_CTYPE 'C'")
}

// Pool returns a pool over a new migrated database (see URL), closed when t
// ends. The pool's size can be set with pool_max_conns in the URL's options
// by calling pgxpool.New(URL(t)) yourself instead.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return PoolFor(t, URL(t))
}

// HasSetting reports whether the test server has the parameter name — one
// only newer releases have (transaction_timeout, PostgreSQL 17) — and logs
// when it does not, so that a test that adds cases for it says what it
// left out.
func HasSetting(t testing.TB, name string) bool {
	t.Helper()
	s := provision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", s.source, redact.ErrorFor(err, s.adminURL))
	}
	defer func() { _ = conn.Close(ctx) }()
	var (
		has     bool
		version string
	)
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_settings WHERE name = $1), current_setting('server_version')`,
		name).Scan(&has, &version); err != nil {
		t.Fatalf("pgtest: look for setting %s: %v", name, err)
	}
	if !has {
		t.Logf("the test server (PostgreSQL %s) has no setting %s: what needs it runs on a server that has it", version, name)
	}
	return has
}

// ExecModes are pgx's query exec modes, for tests that run a statement in
// each (poolers need the modes without prepared statements, and pgx
// encodes arguments differently in each).
var ExecModes = []pgx.QueryExecMode{
	pgx.QueryExecModeCacheStatement,
	pgx.QueryExecModeCacheDescribe,
	pgx.QueryExecModeDescribeExec,
	pgx.QueryExecModeExec,
	pgx.QueryExecModeSimpleProtocol,
}

// PoolFor opens a pool over databaseURL, adjusted by opts (pool size, a
// proxy's address, a tracer), and pings it. When t ends it fails t if a
// connection is still acquired — whatever the test called must have given
// its connection back — and closes the pool (without waiting for the
// connections still acquired, which Close would wait for).
func PoolFor(t testing.TB, databaseURL string, opts ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		t.Fatalf("pgtest: parse database URL: %v", redact.ErrorFor(err, databaseURL))
	}
	for _, o := range opts {
		o(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: open pool: %v", redact.ErrorFor(err, databaseURL))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		t.Fatalf("pgtest: ping: %v", redact.ErrorFor(err, databaseURL))
	}
	t.Cleanup(func() {
		if n := Acquired(pool); n != 0 {
			t.Errorf("pgtest: %d connections still acquired from the pool at the end of the test", n)
			// Close waits until every acquired connection is given back:
			// a test that failed while holding one (a lock it took before
			// t.Fatal) would hang here until go test's timeout, which
			// prints no test's log, instead of failing with its message.
			go pool.Close()
			return
		}
		pool.Close()
	})
	return pool
}

// newDatabase creates a database from template tpl, with the clauses of
// CREATE DATABASE in opts appended, that is dropped when t ends.
func newDatabase(t testing.TB, s *server, tpl, opts string) string {
	t.Helper()
	name := "pgfence_test_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", s.source, redact.ErrorFor(err, s.adminURL))
	}
	defer admin.Close(context.Background())
	create := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{tpl}.Sanitize() + opts
	if _, err := admin.Exec(ctx, create); err != nil {
		t.Fatalf("pgtest: %s: %v%s", create, err, createDBHint(err))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, s.adminURL)
		if err != nil {
			t.Errorf("pgtest: connect to drop %s: %v", name, redact.ErrorFor(err, s.adminURL))
			return
		}
		defer admin.Close(context.Background())
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	u, err := withDatabase(s.adminURL, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return u
}

// createDBHint says what a CREATE DATABASE refused for want of privilege
// needs, or "".
func createDBHint(err error) string {
	if pgerr.Code(err) != "42501" {
		return ""
	}
	return " (each test gets a database of its own: the role of " + EnvURL + " needs CREATEDB, ALTER ROLE ... CREATEDB)"
}

// template returns the name of the migrated template database on s,
// building it once per server and role under an advisory lock so that
// concurrent test processes build it once. The name carries a hash of
// the role: on a server several people share (PGFENCE_TEST_DATABASE_URL), a
// template migrated by another role holds a schema its owner's privileges
// decide, which the cloning role may not use (nothing in schema pgfence
// is PUBLIC's), and one migrated by a role that could not create
// pgfence_client and pgfence_operator grants them nothing.
func template(s *server) (string, error) {
	tplMu.Lock()
	defer tplMu.Unlock()
	if tplName != "" {
		return tplName, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return "", redact.ErrorFor(fmt.Errorf("connect to %s: %w", s.source, err), s.adminURL)
	}
	defer admin.Close(context.Background())
	var role string
	if err := admin.QueryRow(ctx, "SELECT current_user").Scan(&role); err != nil {
		return "", fmt.Errorf("read the role: %w", err)
	}
	hash, err := migrationsHash(role)
	if err != nil {
		return "", err
	}
	name := "pgfence_tpl_" + hash
	// Any constant works; this one spells "pgfence tpl".
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(7451941893224720236)"); err != nil {
		return "", fmt.Errorf("lock template build: %w", err)
	}
	var ready bool
	err = admin.QueryRow(ctx, "SELECT coalesce(bool_or(datistemplate), false) FROM pg_database WHERE datname = $1", name).Scan(&ready)
	if err != nil {
		return "", fmt.Errorf("look up template: %w", err)
	}
	if !ready {
		id := pgx.Identifier{name}.Sanitize()
		// A half-built template from a crashed run is rebuilt from scratch.
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+id+" WITH (FORCE)"); err != nil {
			return "", fmt.Errorf("drop stale template: %w", err)
		}
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+id+" TEMPLATE template0"); err != nil {
			return "", fmt.Errorf("create template: %w%s", err, createDBHint(err))
		}
		u, err := withDatabase(s.adminURL, name)
		if err != nil {
			return "", err
		}
		if err := migrations.Up(ctx, u); err != nil {
			return "", fmt.Errorf("migrate template: %w", err)
		}
		if _, err := admin.Exec(ctx, "ALTER DATABASE "+id+" WITH IS_TEMPLATE true"); err != nil {
			return "", fmt.Errorf("mark template: %w", err)
		}
	}
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_unlock(7451941893224720236)"); err != nil {
		return "", fmt.Errorf("unlock template build: %w", err)
	}
	tplName = name
	return name, nil
}

// migrationsHash identifies the content of the embedded migrations, as
// applied by role.
func migrationsHash(role string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", role)
	var names []string
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			names = append(names, path)
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read embedded migrations: %w", err)
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := fs.ReadFile(migrations.FS, n)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", n, err)
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// withDatabase returns databaseURL pointing at database name instead.
// It accepts URLs and keyword/value connection strings.
func withDatabase(databaseURL, name string) (string, error) {
	if strings.HasPrefix(databaseURL, "postgres://") || strings.HasPrefix(databaseURL, "postgresql://") {
		u, err := url.Parse(databaseURL)
		if err != nil {
			return "", redact.ErrorFor(fmt.Errorf("parse %s: %w", EnvURL, err), databaseURL)
		}
		u.Path = "/" + name
		q := u.Query()
		q.Del("dbname")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	// Keyword/value: a later keyword overrides an earlier one.
	return databaseURL + " dbname=" + name, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}

// Acquired returns pool's count of acquired connections once it has
// settled. An Acquire whose context is cancelled while a new connection is
// being dialled returns at once, but pgxpool finishes the dial in the
// background and counts that connection as acquired until it puts it back,
// idle, a moment later: the pool's design, not a leak. So Acquired waits up
// to 5 s for the count to reach zero, then reports what is left. Tests use
// it to check that nothing they called kept a connection.
func Acquired(pool *pgxpool.Pool) int32 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := pool.Stat().AcquiredConns()
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond) // no event announces the background put-back
	}
}

// WaitFor polls cond every 10ms until it holds, and fails t with what if it
// still does not after timeout. It is for conditions that have no channel
// to wait on — a row in the database, a pool's counters; give a generous
// timeout (tests share two cores).
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Poll polls cond every 10ms until it holds (true) or timeout has passed
// (false). Unlike WaitFor it fails nothing, so a goroutine other than the
// test's can use it and clean up before it reports.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // polling: no event announces the condition
	}
	return true
}

// Split runs b.N calls of op spread over goroutines goroutines, op(g, i)
// being goroutine g's i-th call, and waits for them. A goroutine whose op
// fails reports the error on b and stops.
func Split(b *testing.B, goroutines int, op func(g, i int) error) {
	var wg sync.WaitGroup
	for g := range goroutines {
		n := b.N / goroutines
		if g < b.N%goroutines {
			n++
		}
		wg.Go(func() {
			for i := range n {
				if err := op(g, i); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}
