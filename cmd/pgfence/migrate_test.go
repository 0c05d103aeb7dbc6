package main

import (
	"context"
	"io/fs"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

func itoa(n int) string { return strconv.Itoa(n) }

// latestMigration is the highest version among the embedded files.
func latestMigration(t *testing.T) int {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	latest := 0
	for _, n := range names {
		v, err := strconv.Atoi(strings.SplitN(n, "_", 2)[0])
		if err != nil {
			t.Fatalf("migration file %s: %v", n, err)
		}
		latest = max(latest, v)
	}
	return latest
}

func TestMigrateUpVersionDown(t *testing.T) {
	t.Parallel()
	_ = pgtest.URL(t) // a migrated database: it uses the roles, so down keeps them
	url := pgtest.EmptyURL(t)
	schemaExists := func() bool {
		t.Helper()
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		var ok bool
		if err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pgfence')").Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	latest := itoa(latestMigration(t))

	if r := db(t, url, "migrate", "version"); r.code != 0 || r.stdout != "0\n" {
		t.Fatalf("version before up: exit %d, stdout %q; want 0", r.code, r.stdout)
	}
	if r := db(t, url, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "version "+latest) || strings.Contains(r.stderr, "NOTICE") {
		t.Fatalf("up: exit %d, stdout %q, stderr %q; want no notice (a superuser may do everything)", r.code, r.stdout, r.stderr)
	}
	if !schemaExists() {
		t.Fatal("schema pgfence missing after migrate up")
	}
	if r := db(t, url, "migrate", "up"); r.code != 0 {
		t.Fatalf("second up: exit %d, want 0 (nothing to do)", r.code)
	}
	if r := db(t, url, "migrate", "version"); r.code != 0 || r.stdout != latest+"\n" {
		t.Fatalf("version after up: exit %d, stdout %q; want %s", r.code, r.stdout, latest)
	}
	// The server's other databases use the roles: Down keeps them, and the
	// migration's notice says so.
	if r := db(t, url, "migrate", "down"); r.code != 0 || !strings.Contains(r.stdout, "version 0") ||
		!strings.Contains(r.stderr, "NOTICE: pgfence: roles pgfence_client and pgfence_operator kept") {
		t.Fatalf("down: exit %d, stdout %q, stderr %q; want the notice that the roles were kept", r.code, r.stdout, r.stderr)
	}
	if schemaExists() {
		t.Fatal("schema pgfence still there after migrate down")
	}
	if r := db(t, url, "migrate", "version"); r.code != 0 || r.stdout != "0\n" {
		t.Fatalf("version after down: exit %d, stdout %q; want 0", r.code, r.stdout)
	}
}

// TestMigrateForce (scenario: a migration's connection was lost, the
// version is dirty, and the operator has checked that nothing of it
// committed). version says dirty and names force; force records the
// version, clean, without running anything; up then goes on from there.
func TestMigrateForce(t *testing.T) {
	t.Parallel()
	_ = pgtest.URL(t) // a migrated database: it uses the roles, so they exist
	url := pgtest.EmptyURL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE `+migrations.Table+` (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
INSERT INTO `+migrations.Table+` VALUES (1, true)`); err != nil {
		t.Fatal(err)
	}
	if r := db(t, url, "migrate", "version"); r.code != exitFailure || !strings.Contains(r.stdout, "1 (dirty") || !strings.Contains(r.stdout, "pgfence migrate force N") {
		t.Fatalf("version when dirty: exit %d, stdout %q; want exit %d, dirty, and how to force", r.code, r.stdout, exitFailure)
	}
	if r := db(t, url, "migrate", "force", "0"); r.code != 0 || !strings.Contains(r.stdout, "recorded at version 0, clean (no migration was run)") {
		t.Fatalf("force 0: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := db(t, url, "migrate", "version"); r.code != 0 || r.stdout != "0\n" {
		t.Fatalf("version after force 0: exit %d, stdout %q; want 0", r.code, r.stdout)
	}
	latest := itoa(latestMigration(t))
	if r := db(t, url, "migrate", "up"); r.code != 0 || !strings.Contains(r.stdout, "version "+latest) {
		t.Fatalf("up after force: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
