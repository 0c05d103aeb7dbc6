package migrations_test

import (
	"context"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestDownDropsTheRoles documents what Down does to the roles in a cluster
// where no other database uses them: migration 4's down file drops
// pgfence_client and pgfence_operator, and with them every membership
// granted in them (GRANT pgfence_client TO app). Up creates the roles
// again, without the members: the grants must be made again.
func TestDownDropsTheRoles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.StartCluster(t) // the roles are cluster-wide: a cluster of the test's own
	u := c.URL("postgres")
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, u)
	if _, err := conn.Exec(ctx, `CREATE ROLE app LOGIN IN ROLE pgfence_client`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Down(ctx, u); err != nil {
		t.Fatal(err)
	}
	var roles int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname IN ('pgfence_client', 'pgfence_operator')`).Scan(&roles); err != nil {
		t.Fatal(err)
	}
	if roles != 0 {
		t.Fatalf("after Down, %d of the roles pgfence_client and pgfence_operator are left, want none", roles)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	var member bool
	if err := conn.QueryRow(ctx, `SELECT pg_has_role('app', 'pgfence_client', 'MEMBER')`).Scan(&member); err != nil {
		t.Fatal(err)
	}
	if member {
		t.Fatal("after Down and Up, app is a member of pgfence_client again: the roles were kept")
	}
}
