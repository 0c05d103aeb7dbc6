package migrations_test

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestUpCurrentAsClient: replicas that run Up at start-up and log in as an
// application role (a pgfence_client) find the schema current. Up needs
// SELECT on the bookkeeping table to see that, and nothing else: no CREATE
// on its schema.
func TestUpCurrentAsClient(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	_, appURL := newRole(t, u, `GRANT pgfence_client TO {role}`)
	err := migrations.Up(ctx, appURL)
	if code := sqlstateOf(err); code != "42501" {
		t.Fatalf("Up as a pgfence_client that may not read %s: %v (SQLSTATE %q), want 42501", migrations.Table, err, code)
	}
	if _, err := connect(t, u).Exec(ctx, `GRANT SELECT ON `+migrations.Table+` TO pgfence_client`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, appURL); err != nil {
		t.Fatalf("Up as a pgfence_client on a current schema: %v", err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(ctx, appURL); err != nil || v != latest || dirty {
		t.Fatalf("Version as a pgfence_client: %d, %v, %v; want %d, false, nil", v, dirty, err, latest)
	}
}
