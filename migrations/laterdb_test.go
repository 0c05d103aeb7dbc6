package migrations_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestLaterDatabaseByAnotherRole: the roles are cluster-wide, so the
// migration of a second database finds pgfence_client and
// pgfence_operator made by the first. Its role may own nothing but that
// database: no CREATEROLE, no ADMIN OPTION on the roles (from PostgreSQL 16
// on, CREATEROLE alone would not do either). Migration 4 granted
// pgfence_client to pgfence_operator again and failed there ("must have
// admin option on role"), leaving the database dirty at version 4; the
// membership is there already, so it is skipped now, and the migrations
// complete, grant the roles their privileges in the new database, and
// revert.
func TestLaterDatabaseByAnotherRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.EmptyURL(t) // the shared server, whose first database was migrated by a superuser
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	db := pgx.Identifier{strings.TrimPrefix(pu.Path, "/")}.Sanitize()
	_, ru := newRole(t, u, `ALTER DATABASE `+db+` OWNER TO {role}`)
	t.Cleanup(func() { // before newRole's cleanup drops the role
		if _, err := connect(t, u).Exec(context.Background(), `ALTER DATABASE `+db+` OWNER TO CURRENT_USER`); err != nil {
			t.Error(err)
		}
	})
	if err := migrations.Up(ctx, ru); err != nil {
		t.Fatalf("Up by the owner of a later database: %v", err)
	}
	latest, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	if v, dirty, err := migrations.Version(ctx, ru); err != nil || dirty || v != latest {
		t.Fatalf("Version = %d, dirty %v, %v; want %d, clean", v, dirty, err, latest)
	}
	conn := connect(t, u)
	var client, operator bool
	if err := conn.QueryRow(ctx, `SELECT has_function_privilege('pgfence_client', 'pgfence.try_acquire(text, text, bigint)', 'EXECUTE'),
		pg_has_role('pgfence_operator', 'pgfence_client', 'MEMBER')`).Scan(&client, &operator); err != nil {
		t.Fatal(err)
	}
	if !client || !operator {
		t.Errorf("pgfence_client may run try_acquire: %v; pgfence_operator is a client: %v; want both", client, operator)
	}
	if err := migrations.Down(ctx, ru); err != nil {
		t.Fatalf("Down by the owner of a later database: %v", err)
	}
	var roles int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_roles WHERE rolname IN ('pgfence_client', 'pgfence_operator')`).Scan(&roles); err != nil {
		t.Fatal(err)
	}
	if roles != 2 {
		t.Errorf("%d of the roles left after Down of a later database, want 2 (the first database uses them)", roles)
	}
}
