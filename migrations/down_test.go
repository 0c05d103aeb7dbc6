package migrations_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// assertUntouched checks that a refused Down left the database as Up did:
// the latest version, clean, and every pgfence object in place.
func assertUntouched(t *testing.T, u string, conn *pgx.Conn, before []string) {
	t.Helper()
	ctx := context.Background()
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest(t) || dirty {
		t.Errorf("Version after a refused Down = %d, dirty %v, %v; want %d, clean: a refused Down must change nothing", v, dirty, err, latest(t))
	}
	if after := objects(t, conn); !reflect.DeepEqual(before, after) {
		t.Errorf("a refused Down changed pgfence's objects:\nbefore: %v\n after: %v", before, after)
	}
}

// TestRefusedDownChangesNothing (scenario: an application view reads
// pgfence.leases). Down refuses, as its doc says, and refuses before it
// reverts anything: not after reverting fourteen migrations, leaving the
// schema of migration 1 behind, clients broken and the version dirty.
func TestRefusedDownChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	conn := connect(t, u)
	if _, err := conn.Exec(ctx, `CREATE VIEW app_leases AS SELECT name FROM pgfence.leases`); err != nil {
		t.Fatal(err)
	}
	before := objects(t, conn)
	err := migrations.Down(ctx, u)
	if err == nil {
		t.Fatal("Down dropped pgfence although an application view depends on it")
	}
	if !errors.Is(err, migrations.ErrDownRefused) || !strings.Contains(err.Error(), "app_leases") {
		t.Errorf("Down: %v; want ErrDownRefused naming the dependent view", err)
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM app_leases").Scan(&n); err != nil {
		t.Fatalf("application view gone after a refused Down: %v", err)
	}
	assertUntouched(t, u, conn, before)
}

// TestDownByMigrationRoleRefusesOthersTables (scenario: a role that is
// not a superuser ran the migrations, and the application role protected
// the table it owns, as migration 13 allows). Down cannot remove that
// table's guard triggers: it refuses, naming the table, before reverting
// anything.
func TestDownByMigrationRoleRefusesOthersTables(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.EmptyURL(t)
	var db string
	if err := connect(t, u).QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	// ADMIN OPTION: from PostgreSQL 16, CREATEROLE alone does not let a
	// role grant the memberships of roles another role created.
	_, migratorURL := newRole(t, u,
		`ALTER ROLE {role} CREATEROLE`,
		`GRANT pgfence_client, pgfence_operator TO {role} WITH ADMIN OPTION`,
		`GRANT CREATE ON DATABASE `+pgx.Identifier{db}.Sanitize()+` TO {role}`,
		`GRANT CREATE ON SCHEMA public TO {role}`)
	if err := migrations.Up(ctx, migratorURL); err != nil {
		t.Fatalf("Up as a migration role that is not a superuser: %v", err)
	}
	_, appURL := newRole(t, u, `GRANT pgfence_client TO {role}`, `GRANT CREATE ON SCHEMA public TO {role}`)
	app := connect(t, appURL)
	for _, q := range []string{
		`CREATE TABLE app_owned (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('app_owned')`,
	} {
		if _, err := app.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	conn := connect(t, u)
	before := objects(t, conn)
	err := migrations.Down(ctx, migratorURL)
	if err == nil {
		t.Fatal("Down as a role that does not own a protected table succeeded")
	}
	if !errors.Is(err, migrations.ErrDownRefused) || !strings.Contains(err.Error(), "app_owned") {
		t.Errorf("Down: %v; want ErrDownRefused naming the table", err)
	}
	assertUntouched(t, u, conn, before)

	// Once the table's owner has removed the guard, Down goes through.
	for _, q := range []string{`DROP TRIGGER pgfence_guard ON app_owned`, `DROP TRIGGER pgfence_guard_truncate ON app_owned`} {
		if _, err := app.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := migrations.Down(ctx, migratorURL); err != nil {
		t.Fatalf("Down once the guard is gone: %v", err)
	}
	if left := objects(t, conn); len(left) != 0 {
		t.Fatalf("Down left pgfence objects behind: %v", left)
	}
}
