package integration_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// TestComposeFile loads docker-compose.yml with the Compose specification's
// own loader (no Docker engine is needed to validate it) and checks the
// services, the healthcheck and the start-up order the README promises.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cli.NewProjectOptions([]string{filepath.Join(root, "docker-compose.yml")},
		cli.WithWorkingDirectory(root), cli.WithName("pgfence"))
	if err != nil {
		t.Fatalf("compose options: %v", err)
	}
	project, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("load docker-compose.yml: %v", err)
	}
	svc := func(name string) types.ServiceConfig {
		t.Helper()
		s, err := project.GetService(name)
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		return s
	}

	pg := svc("postgres")
	if !strings.HasPrefix(pg.Image, "postgres:17") {
		t.Errorf("postgres image = %q, want postgres:17", pg.Image)
	}
	// Over TCP: during initialisation the image's entrypoint runs a
	// temporary server on the Unix socket only, which a socket check
	// would report ready just before it stops.
	if pg.HealthCheck == nil || len(pg.HealthCheck.Test) == 0 || !strings.Contains(strings.Join(pg.HealthCheck.Test, " "), "pg_isready -h 127.0.0.1") {
		t.Errorf("postgres has no pg_isready healthcheck over TCP (-h 127.0.0.1): %+v", pg.HealthCheck)
	}

	mig := svc("migrate")
	if !strings.HasPrefix(mig.Image, "migrate/migrate") {
		t.Errorf("migrate image = %q, want the upstream migrate/migrate", mig.Image)
	}
	if dep, ok := mig.DependsOn["postgres"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("migrate must wait for postgres to be healthy: %+v", mig.DependsOn)
	}
	cmd := strings.Join(mig.Command, " ")
	for _, want := range []string{"-path=/migrations", "x-migrations-table=pgfence_schema_migrations", "up"} {
		if !strings.Contains(cmd, want) {
			t.Errorf("migrate command %q lacks %q", cmd, want)
		}
	}
	mounted := false
	for _, v := range mig.Volumes {
		if v.Target == "/migrations" && filepath.Clean(v.Source) == filepath.Join(root, "migrations") {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("migrate does not mount ./migrations at /migrations: %+v", mig.Volumes)
	}

	w := svc("worker")
	if w.Build == nil || w.Build.Dockerfile != "Dockerfile" {
		t.Fatalf("worker is not built from the repository's Dockerfile: %+v", w.Build)
	}
	if _, err := os.Stat(filepath.Join(root, "Dockerfile")); err != nil {
		t.Errorf("worker builds from a Dockerfile the repository lacks: %v", err)
	}
	if w.Deploy == nil || w.Deploy.Replicas == nil || *w.Deploy.Replicas != 5 {
		t.Errorf("worker replicas = %+v, want 5", w.Deploy)
	}
	if got := strings.Join(w.Command, " "); got != "demo worker" {
		t.Errorf("worker command = %q, want the demo worker", got)
	}
	if dep, ok := w.DependsOn["migrate"]; !ok || dep.Condition != types.ServiceConditionCompletedSuccessfully {
		t.Errorf("worker must wait for migrate to complete: %+v", w.DependsOn)
	}
	if dep, ok := w.DependsOn["postgres"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("worker must wait for postgres to be healthy: %+v", w.DependsOn)
	}
	if u := w.Environment["DATABASE_URL"]; u == nil || !strings.Contains(*u, "@postgres:5432/") {
		t.Errorf("worker DATABASE_URL does not point at the postgres service: %v", u)
	}
}
