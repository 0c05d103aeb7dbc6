package pgtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestURLIsMigratedAndIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Logf("server: %s", pgtest.Source(t))
	a, b := pgtest.URL(t), pgtest.URL(t)
	if a == b {
		t.Fatalf("two tests got the same database %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	if _, err := ca.Exec(ctx, "INSERT INTO pgfence.leases (name, owner, fence, expires_at) VALUES ('x', 'o', 1, clock_timestamp() + interval '1 minute')"); err != nil {
		t.Fatalf("migrated schema missing: %v", err)
	}
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pgfence.leases").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("database b sees %d leases written to database a", n)
	}
}

func TestEmptyURLHasNoSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.EmptyURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgfence')").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatal("empty database has schema pgfence")
	}
}

// TestClusterStopStartKill drives a throwaway cluster through every way a
// fault test stops it; data written before survives each restart.
func TestClusterStopStartKill(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.WithSetting("idle_session_timeout", "0"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(sql string) int {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	exec("SELECT count(*) FROM (SELECT 1 FROM pg_class LIMIT 1) s")
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	port := c.Port()
	for i, stop := range []func() error{
		func() error { return c.Stop("fast") },
		func() error { return c.Stop("immediate") },
		c.Kill,
	} {
		if err := stop(); err != nil {
			t.Fatalf("stop %d: %v", i, err)
		}
		if c.Pid() != 0 {
			t.Fatalf("stop %d: still running", i)
		}
		if _, err := pgx.Connect(ctx, c.URL("postgres")); err == nil {
			t.Fatalf("stop %d: server still accepts connections", i)
		}
		if err := c.Start(); err != nil {
			t.Fatalf("start after stop %d: %v", i, err)
		}
		if c.Port() != port {
			t.Fatalf("port changed across restart: %d -> %d", port, c.Port())
		}
		if n := exec("SELECT count(*)::int FROM t"); n != 1 {
			t.Fatalf("after stop %d: table has %d rows, want 1", i, n)
		}
	}
	if err := c.Stop("bogus"); err == nil {
		t.Fatal("Stop accepted an unknown mode")
	}
}

// TestLocalBinariesFallback runs this package's tests again in a child
// process without PGFENCE_TEST_DATABASE_URL and with
// PGFENCE_TEST_PROVISIONER=local: the child must provision a throwaway
// cluster from the local binaries (as root, running it as an unprivileged
// user) and pass.
func TestLocalBinariesFallback(t *testing.T) {
	if os.Getenv("PGFENCE_TEST_CHILD") != "" {
		t.Skip("already the child") // keeps the child from recursing; the parent's run counts
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Forced: with a Docker engine and a usable image, the child would
	// otherwise take a container.
	out, err := childTest(ctx, pgtest.EnvProvisioner+"=local").CombinedOutput()
	if err != nil {
		t.Fatalf("child without %s failed: %v\n%s", pgtest.EnvURL, err, out)
	}
	if !strings.Contains(string(out), "server: local binaries") {
		t.Fatalf("child did not use the local binaries:\n%s", out)
	}
}

// TestRoleWithoutCreateDB runs one test in a child process whose
// PGFENCE_TEST_DATABASE_URL names a role that may not create databases:
// the child must fail saying what the role needs, not only "permission
// denied".
func TestRoleWithoutCreateDB(t *testing.T) {
	if os.Getenv("PGFENCE_TEST_CHILD") != "" {
		t.Skip("already the child") // keeps the child from recursing; the parent's run counts
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, childURL := pgtest.LoginRole(t, pgtest.URL(t), "NOCREATEDB")
	out, err := childTest(ctx, pgtest.EnvURL+"="+childURL).CombinedOutput()
	if err == nil {
		t.Fatalf("child with a role without CREATEDB passed:\n%s", out)
	}
	if !strings.Contains(string(out), "needs CREATEDB") {
		t.Fatalf("child failed without saying that the role needs CREATEDB:\n%s", out)
	}
}

// TestSecondRoleGetsATemplateOfItsOwn (scenario: two people share one
// server through PGFENCE_TEST_DATABASE_URL, with roles of their own). The
// second, who may create databases and nothing more, must get databases
// whose pgfence schema it can use. It got clones of the first role's
// template, whose schema only that role (and pgfence_client) may use:
// "permission denied for schema pgfence".
func TestSecondRoleGetsATemplateOfItsOwn(t *testing.T) {
	if os.Getenv("PGFENCE_TEST_CHILD") != "" {
		t.Skip("already the child")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, childURL := pgtest.LoginRole(t, pgtest.URL(t), "CREATEDB") // after this role's template exists
	out, err := childTest(ctx, pgtest.EnvURL+"="+childURL).CombinedOutput()
	if err != nil {
		t.Fatalf("child as a second role that may create databases failed: %v\n%s", err, out)
	}
}

// childTest runs TestURLIsMigratedAndIsolated in a child process, with
// this one's environment but the server chosen by env alone.
func childTest(ctx context.Context, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestURLIsMigratedAndIsolated$", "-test.v")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, pgtest.EnvURL+"=") && !strings.HasPrefix(kv, pgtest.EnvProvisioner+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, "PGFENCE_TEST_CHILD=1"), env...)
	return cmd
}
