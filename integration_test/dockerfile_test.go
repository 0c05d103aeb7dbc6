package integration_test

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDockerfile builds the repository's Dockerfile and runs the image as
// the README shows: `pgfence migrate up` and then `pgfence demo worker`
// against the compose project's database, on the project's network.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	img := buildPgfenceImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The final stage has a shell, and runs as an unprivileged user.
	if out := run(t, ctx, "", nil, "docker", "run", "--rm", "--entrypoint", "sh", img, "-c", "id -u"); strings.TrimSpace(out) != "10001" {
		t.Errorf("image runs as user %q, want 10001", strings.TrimSpace(out))
	}

	p := newComposeProject(t, img)
	start := time.Now()
	p.run(ctx, "up", "-d", "postgres")
	pool := p.pool(ctx)
	t.Logf("compose postgres up in %v", time.Since(start).Round(time.Millisecond))

	dbURL := "DATABASE_URL=postgres://app:app@postgres:5432/app?sslmode=disable"
	pgfence := func(args ...string) string {
		t.Helper()
		return run(t, ctx, "", nil, "docker", append([]string{"run", "--rm", "--network", p.network(), "-e", dbURL, img}, args...)...)
	}
	out := pgfence("migrate", "up")
	t.Logf("pgfence migrate up:\n%s", out)
	var version int
	if err := pool.QueryRow(ctx, `SELECT max(version) FROM pgfence_schema_migrations`).Scan(&version); err != nil {
		t.Fatalf("after pgfence migrate up in the image: %v", err)
	}
	if version == 0 {
		t.Fatal("pgfence migrate up applied no migration")
	}
	// Again: nothing to do, same version.
	if again := pgfence("migrate", "up"); again != out {
		t.Errorf("second pgfence migrate up said %q, the first %q", again, out)
	}

	out = pgfence("demo", "worker", "--name", "dockerfile-test", "--periods", "3", "--work", "100ms")
	t.Logf("pgfence demo worker:\n%s", out)
	if !strings.Contains(out, "dockerfile-test: finished") {
		t.Errorf("demo worker did not finish:\n%s", out)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence_demo.periods WHERE worker = 'dockerfile-test'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Errorf("the worker in the image wrote %d periods, want 3", n)
	}
}
