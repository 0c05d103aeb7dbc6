package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// The promise (migrations doc, "Bookkeeping"): pgfence records its version
// in pgfence_schema_migrations, so that its history never collides with an
// application that also uses golang-migrate with the default
// schema_migrations. Here the application got there first, at a version
// pgfence does not have: Up applies every pgfence migration all the same,
// and Up and Down leave the application's record as it was.
func TestBookkeepingApartFromTheApplications(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.EmptyURL(t)
	conn := connect(t, u)
	if _, err := conn.Exec(ctx, `CREATE TABLE schema_migrations (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
INSERT INTO schema_migrations VALUES (20240101120000, false)`); err != nil {
		t.Fatal(err)
	}
	appRecord := func(when string) {
		t.Helper()
		var (
			n     int
			v     int64
			dirty bool
		)
		if err := conn.QueryRow(ctx, `SELECT count(*), max(version), bool_or(dirty) FROM schema_migrations`).Scan(&n, &v, &dirty); err != nil {
			t.Fatalf("%s: the application's schema_migrations: %v", when, err)
		}
		if n != 1 || v != 20240101120000 || dirty {
			t.Errorf("%s: the application's schema_migrations holds %d rows, version %d, dirty %v; want its own record alone", when, n, v, dirty)
		}
	}

	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up beside an application's schema_migrations: %v", err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest || dirty {
		t.Errorf("Version after Up = %d, %v, %v; want %d, clean", v, dirty, err, latest)
	}
	var schema bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('pgfence.leases') IS NOT NULL`).Scan(&schema); err != nil || !schema {
		t.Errorf("Up did not create pgfence.leases: %v", err)
	}
	appRecord("after Up")

	if err := migrations.Down(ctx, u); err != nil {
		t.Fatalf("Down: %v", err)
	}
	appRecord("after Down")
}
