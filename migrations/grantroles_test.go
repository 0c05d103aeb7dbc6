package migrations_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// rolePrivileges lists the privileges pgfence_client and pgfence_operator
// hold on schema pgfence and on its relations and routines, in a stable
// order.
func rolePrivileges(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	const q = `
SELECT kind || ' ' || obj || ' to ' || grantee || ': ' || priv FROM (
  SELECT 'routine' AS kind, p.oid::regprocedure::text AS obj, a.grantee::regrole::text AS grantee, a.privilege_type AS priv
    FROM pg_proc p, aclexplode(p.proacl) a WHERE p.pronamespace = 'pgfence'::regnamespace
  UNION ALL
  SELECT 'relation', c.oid::regclass::text, a.grantee::regrole::text, a.privilege_type
    FROM pg_class c, aclexplode(c.relacl) a WHERE c.relnamespace = 'pgfence'::regnamespace
  UNION ALL
  SELECT 'schema', n.nspname::text, a.grantee::regrole::text, a.privilege_type
    FROM pg_namespace n, aclexplode(n.nspacl) a WHERE n.nspname = 'pgfence'
) AS x
 WHERE grantee IN ('pgfence_client', 'pgfence_operator')
 ORDER BY 1`
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("privileges: %v", err)
	}
	privs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("privileges: %v", err)
	}
	return privs
}

// TestGrantRolesRestoresEveryPrivilege (scenario: the migration role could
// not create roles, so an operator created them afterwards and ran
// pgfence.grant_roles(), as docs/operators.md says). grant_roles must give
// the roles every privilege the migrations give them where the roles
// already exist — a client without one of them fails.
func TestGrantRolesRestoresEveryPrivilege(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, pgtest.URL(t))
	want := rolePrivileges(t, conn)
	if len(want) == 0 {
		t.Fatal("the migrations granted the roles nothing")
	}
	// What the database holds when the roles came after the migrations.
	for _, q := range []string{
		`REVOKE ALL ON ALL ROUTINES IN SCHEMA pgfence FROM pgfence_client, pgfence_operator`,
		`REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM pgfence_client, pgfence_operator`,
		`REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgfence FROM pgfence_client, pgfence_operator`,
		`REVOKE ALL ON SCHEMA pgfence FROM pgfence_client, pgfence_operator`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if left := rolePrivileges(t, conn); len(left) != 0 {
		t.Fatalf("privileges left after revoking: %v", left)
	}
	if _, err := conn.Exec(ctx, `SELECT pgfence.grant_roles()`); err != nil {
		t.Fatalf("grant_roles: %v", err)
	}
	got := rolePrivileges(t, conn)
	for _, p := range want {
		if !slices.Contains(got, p) {
			t.Errorf("grant_roles did not grant %s", p)
		}
	}
	for _, p := range got {
		if !slices.Contains(want, p) {
			t.Errorf("grant_roles granted %s, which the migrations do not", p)
		}
	}
}

// TestNothingIsPublics: PUBLIC may use nothing in schema pgfence but
// protect (which only a pgfence_client can run to its end) — not by a
// grant, and not by PostgreSQL's default for a routine that was never
// granted or revoked (EXECUTE for PUBLIC).
func TestNothingIsPublics(t *testing.T) {
	t.Parallel()
	conn := connect(t, pgtest.URL(t))
	rows, err := conn.Query(context.Background(), `
SELECT p.oid::regprocedure::text
  FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
 WHERE p.pronamespace = 'pgfence'::regnamespace AND a.grantee = 0
UNION ALL
SELECT c.oid::regclass::text
  FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
 WHERE c.relnamespace = 'pgfence'::regnamespace AND a.grantee = 0
UNION ALL
SELECT 'schema ' || n.nspname
  FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
 WHERE n.nspname = 'pgfence' AND a.grantee = 0
 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	public, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(public, []string{"pgfence.protect(regclass,name)"}) {
		t.Fatalf("PUBLIC's in schema pgfence: %v, want only pgfence.protect(regclass,name)", public)
	}
}
