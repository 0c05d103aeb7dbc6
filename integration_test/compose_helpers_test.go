package integration_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// composeProject is a docker-compose.yml project of one test, under a
// unique project name, taken down with its volumes when the test ends —
// also when it fails, after printing its logs.
type composeProject struct {
	t    *testing.T
	cmd  []string // docker compose, or docker-compose
	name string
	root string
	env  []string
}

// newComposeProject prepares a project over the repository's
// docker-compose.yml whose worker service runs workerImage (built by
// buildPgfenceImage) and whose PostgreSQL port is a free one on
// 127.0.0.1. The other images come from the environment (PGFENCE_*_IMAGE).
func newComposeProject(t *testing.T, workerImage string) *composeProject {
	t.Helper()
	p := &composeProject{
		t:    t,
		cmd:  composeCommand(t),
		name: "pgfencetest" + randomSuffix(),
		root: repoRoot(t),
		env:  []string{"PGFENCE_WORKER_IMAGE=" + workerImage, "PGFENCE_POSTGRES_PORT=0"},
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if t.Failed() {
			out, _ := p.try(ctx, "logs", "--no-color", "--tail", "200")
			t.Logf("compose logs of %s:\n%s", p.name, out)
		}
		if out, err := p.try(ctx, "down", "-v", "--remove-orphans", "--timeout", "5"); err != nil {
			t.Errorf("compose down %s: %v\n%s", p.name, err, out)
		}
	})
	return p
}

// args is the compose command line for args.
func (p *composeProject) args(args ...string) []string {
	return append(append(append([]string(nil), p.cmd[1:]...), "-p", p.name, "-f", "docker-compose.yml"), args...)
}

// try runs a compose command and returns its output and error.
func (p *composeProject) try(ctx context.Context, args ...string) (string, error) {
	return tryRun(ctx, p.root, p.env, p.cmd[0], p.args(args...)...)
}

// run runs a compose command and fails the test if it fails.
func (p *composeProject) run(ctx context.Context, args ...string) string {
	p.t.Helper()
	return run(p.t, ctx, p.root, p.env, p.cmd[0], p.args(args...)...)
}

// network is the project's default network, which the services share.
func (p *composeProject) network() string { return p.name + "_default" }

// pool connects to the project's PostgreSQL through its published port,
// waiting until it accepts connections; the pool is closed when the test
// ends.
func (p *composeProject) pool(ctx context.Context) *pgxpool.Pool {
	p.t.Helper()
	addr := strings.TrimSpace(p.run(ctx, "port", "postgres", "5432"))
	if _, _, err := net.SplitHostPort(addr); err != nil {
		p.t.Fatalf("compose port postgres 5432 = %q: %v", addr, err)
	}
	u := fmt.Sprintf("postgres://app:app@%s/app?sslmode=disable", addr)
	var pool *pgxpool.Pool
	mustWait(p.t, 2*time.Minute, "the compose database to accept connections", func() (bool, error) {
		pl, err := tryPool(ctx, u)
		if err != nil {
			return false, err // still starting, or the last error on timeout
		}
		pool = pl
		return true, nil
	})
	p.t.Cleanup(pool.Close)
	return pool
}

// tryPool opens a pool over u and pings it.
func tryPool(ctx context.Context, u string) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
