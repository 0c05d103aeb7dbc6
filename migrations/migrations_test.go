package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func TestMain(m *testing.M) {
	// Helper process for TestUpConcurrentProcesses: wait for the go signal
	// (stdin closed), then migrate.
	if u := os.Getenv("PGFENCE_TEST_MIGRATE_UP"); u != "" {
		_, _ = io.Copy(io.Discard, os.Stdin)
		if err := migrations.Up(context.Background(), u); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	pgtest.MainWithURL(m, "DATABASE_URL") // for ExampleUp
}

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return conn
}

// objects lists every object of schema pgfence and every trigger that uses
// pgfence.fence_guard, in a stable order, so that two states of a database
// can be compared.
func objects(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	const q = `
SELECT kind || ' ' || name FROM (
  SELECT 'schema' AS kind, nspname::text AS name FROM pg_namespace WHERE nspname = 'pgfence'
  UNION ALL
  SELECT CASE c.relkind WHEN 'r' THEN 'table' WHEN 'S' THEN 'sequence' WHEN 'i' THEN 'index' WHEN 'v' THEN 'view' ELSE c.relkind::text END,
         c.relname::text
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'pgfence'
  UNION ALL
  SELECT 'function', p.oid::regprocedure::text
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgfence'
  UNION ALL
  SELECT 'constraint', conname::text
    FROM pg_constraint co JOIN pg_namespace n ON n.oid = co.connamespace WHERE n.nspname = 'pgfence'
  UNION ALL
  SELECT 'trigger', tgname || ' on ' || tgrelid::regclass::text
    FROM pg_trigger WHERE tgfoid IN (SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'pgfence')
) o ORDER BY 1`
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("list objects: %v", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("list objects: %v", err)
	}
	return names
}

func TestUpDownUpRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.EmptyURL(t)
	conn := connect(t, u)

	// The application's own objects, one of them protected by pgfence.
	if _, err := conn.Exec(ctx, `
CREATE TABLE app_accounts (id int PRIMARY KEY, balance int, fence bigint NOT NULL DEFAULT 0);
CREATE TABLE app_plain (id int PRIMARY KEY);
INSERT INTO app_accounts VALUES (1, 100, 0);
INSERT INTO app_plain VALUES (1);
CREATE SCHEMA app_schema;`); err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != 0 || dirty {
		t.Fatalf("Version before up = %d, %v, %v; want 0, false, nil", v, dirty, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up: %v", err)
	}
	once := objects(t, conn)
	if len(once) == 0 {
		t.Fatal("Up created nothing")
	}
	if _, err := conn.Exec(ctx, "SELECT pgfence.protect('app_accounts')"); err != nil {
		t.Fatalf("protect: %v", err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("second Up (no change) returned %v, want nil", err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest(t) || dirty {
		t.Fatalf("Version after up = %d, %v, %v; want %d, false, nil", v, dirty, err, latest(t))
	}

	if err := migrations.Down(ctx, u); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if left := objects(t, conn); len(left) != 0 {
		t.Fatalf("Down left pgfence objects behind: %v", left)
	}
	var accounts, plain int
	var schemaExists bool
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM app_accounts), (SELECT count(*) FROM app_plain),
		EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'app_schema')`).Scan(&accounts, &plain, &schemaExists); err != nil {
		t.Fatalf("application objects after Down: %v", err)
	}
	if accounts != 1 || plain != 1 || !schemaExists {
		t.Fatalf("Down touched the application: accounts=%d plain=%d app_schema=%v", accounts, plain, schemaExists)
	}
	// The unprotected table accepts token-less writes again.
	if _, err := conn.Exec(ctx, "UPDATE app_accounts SET balance = 0"); err != nil {
		t.Fatalf("write after Down: %v", err)
	}

	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
	if again := objects(t, conn); !reflect.DeepEqual(once, again) {
		t.Fatalf("up→down→up objects differ from one up:\n once: %v\nagain: %v", once, again)
	}
}

func TestUpConcurrentProcesses(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptyURL(t)
	const procs = 5
	cmds := make([]*exec.Cmd, procs)
	gates := make([]io.WriteCloser, procs)
	outs := make([]*strings.Builder, procs)
	for i := range cmds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PGFENCE_TEST_MIGRATE_UP="+u)
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		gate, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i], gates[i] = cmd, gate
	}
	for _, g := range gates { // all processes are running: let them go at once
		g.Close()
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("process %d: %v\n%s", i, err, outs[i])
		}
	}
	conn := connect(t, u)
	var rows, version int
	if err := conn.QueryRow(context.Background(),
		"SELECT count(*), max(version) FROM "+pgx.Identifier{migrations.Table}.Sanitize()).Scan(&rows, &version); err != nil {
		t.Fatalf("read bookkeeping table: %v", err)
	}
	if rows != 1 || uint(version) != latest(t) {
		t.Fatalf("bookkeeping table has %d rows, version %d; want 1 row, version %d", rows, version, latest(t))
	}
	if got := objects(t, conn); !containsAll(got, "schema pgfence", "table leases", "table fence_floor", "function pgfence.lock_key(text)", "function pgfence.try_acquire(text,text,bigint)", "view lease_status") {
		t.Fatalf("schema not applied: %v", got)
	}
}

func latest(t *testing.T) uint {
	t.Helper()
	v, err := migrations.Latest()
	if err != nil || v < 2 {
		t.Fatalf("Latest() = %d, %v; want at least 2", v, err)
	}
	return v
}

func containsAll(have []string, want ...string) bool {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func TestBadURL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if err := migrations.Up(ctx, "postgres://%zz"); !errors.Is(err, migrations.ErrInvalid) || strings.Contains(err.Error(), "%zz") {
		t.Fatalf("Up with a malformed URL: %v; want ErrInvalid, without the URL", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if err := migrations.Up(canceled, pgtest.EmptyURL(t)); err == nil {
		t.Fatal("Up with a cancelled context succeeded")
	}
}

// UpstreamMigrateVersion is the upstream golang-migrate CLI release the
// migrations are tested with (the package itself no longer imports
// golang-migrate: its module graph pulls in the Docker client).
const UpstreamMigrateVersion = "v4.20.1"

// TestUpstreamCLI proves that the plain migrations/ folder works with the
// upstream golang-migrate CLI (built from the module proxy) and that the CLI
// and this package agree on the bookkeeping.
func TestUpstreamCLI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := t.TempDir()
	// Built as docker/build-images.sh builds the migrate image's CLI (tags,
	// cgo, -trimpath): on a machine that built the image, the packages come
	// from the build cache.
	install := exec.CommandContext(ctx, "go", "install", "-tags", "postgres pgx5", "-trimpath",
		"github.com/golang-migrate/migrate/v4/cmd/migrate@"+UpstreamMigrateVersion)
	install.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	install.Dir = bin
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("build the upstream migrate CLI: %v\n%s", err, out)
	}

	u := pgtest.EmptyURL(t)
	if !strings.HasPrefix(u, "postgres://") {
		t.Fatalf("need a URL-form database URL for the CLI, got %q", u)
	}
	cliURL := "pgx5://" + strings.TrimPrefix(u, "postgres://")
	if strings.Contains(cliURL, "?") {
		cliURL += "&"
	} else {
		cliURL += "?"
	}
	cliURL += "x-migrations-table=" + migrations.Table
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "migrate"), append([]string{"-path", ".", "-database", cliURL}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("migrate %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	cli("up")
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest(t) || dirty {
		t.Fatalf("after CLI up, Version = %d, %v, %v; want %d, false, nil", v, dirty, err, latest(t))
	}
	conn := connect(t, u)
	var key int64
	if err := conn.QueryRow(ctx, "SELECT pgfence.lock_key('billing')").Scan(&key); err != nil {
		t.Fatalf("schema from the CLI is unusable: %v", err)
	}
	if out := cli("version"); strings.TrimSpace(out) != fmt.Sprint(latest(t)) {
		t.Fatalf("CLI version printed %q, want %d", out, latest(t))
	}
	// The default bookkeeping table is untouched: the application's own
	// golang-migrate history cannot collide with ours.
	var defaultTable bool
	if err := conn.QueryRow(ctx, "SELECT to_regclass('schema_migrations') IS NOT NULL").Scan(&defaultTable); err != nil {
		t.Fatal(err)
	}
	if defaultTable {
		t.Fatal("the CLI created schema_migrations; x-migrations-table was ignored")
	}
	if err := migrations.Down(ctx, u); err != nil {
		t.Fatalf("Down after CLI up: %v", err)
	}
	cli("up")
	cli("down", "-all")
	if left := objects(t, conn); len(left) != 0 {
		t.Fatalf("CLI down -all left %v", left)
	}
}

// TestLeaseStatusView checks the operator's view against real rows, judged
// by the database clock.
func TestLeaseStatusView(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, pgtest.URL(t))
	if _, err := conn.Exec(ctx, `
INSERT INTO pgfence.leases (name, owner, fence, acquired_at, renewed_at, expires_at) VALUES
  ('live',    'a', 1, clock_timestamp() - interval '90 seconds', clock_timestamp(), clock_timestamp() + interval '30 seconds'),
  ('expired', 'b', 2, clock_timestamp() - interval '10 minutes', clock_timestamp() - interval '5 minutes', clock_timestamp() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name, Owner        string
		Fence              int64
		HeldFor, ExpiresIn time.Duration
		Expired            bool
	}
	rows, err := conn.Query(ctx, "SELECT name, owner, fence, held_for, expires_in, expired FROM pgfence.lease_status ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("view has %d rows, want 2: %+v", len(got), got)
	}
	exp, live := got[0], got[1]
	// Bounds are generous: a slow CI machine may take seconds between the
	// INSERT and the SELECT.
	if live.Name != "live" || live.Owner != "a" || live.Expired || live.HeldFor < 90*time.Second || live.HeldFor > 150*time.Second ||
		live.ExpiresIn <= 0 || live.ExpiresIn > 30*time.Second {
		t.Errorf("live lease row wrong: %+v", live)
	}
	if exp.Name != "expired" || !exp.Expired || exp.ExpiresIn >= -time.Minute+time.Second || exp.HeldFor < 10*time.Minute {
		t.Errorf("expired lease row wrong: %+v", exp)
	}
	if live.Fence != 1 || exp.Fence != 2 {
		t.Errorf("fences %d, %d; want 1, 2", live.Fence, exp.Fence)
	}
}

// TestRoleNamedPgfence: a role named pgfence finds schema pgfence first on
// its search path ("$user", public) once Up has created it; the bookkeeping
// table must stay where the first Up put it, so that the next Up sees the
// version instead of applying migration 1 again.
func TestRoleNamedPgfence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A cluster of the test's own: a role is the cluster's, and a superuser
	// named pgfence must neither be left on a server the tests share nor
	// be one of its own that the test would use (and drop).
	c := pgtest.StartCluster(t)
	u := c.URL("postgres")
	if _, err := connect(t, u).Exec(ctx, `CREATE ROLE pgfence LOGIN SUPERUSER`); err != nil {
		t.Fatal(err)
	}
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pu.User = url.User("pgfence")
	for i := range 2 {
		if err := migrations.Up(ctx, pu.String()); err != nil {
			t.Fatalf("Up #%d as role pgfence: %v", i+1, err)
		}
		if v, dirty, err := migrations.Version(ctx, pu.String()); err != nil || v != latest(t) || dirty {
			t.Fatalf("Version after Up #%d as role pgfence = %d, %v, %v; want %d", i+1, v, dirty, err, latest(t))
		}
	}
}
