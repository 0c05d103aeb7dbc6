package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// loginRole creates a login role that is a member of member (pgfence_client
// or pgfence_operator) and owns nothing but a table "mine" it may write,
// protected by the guard; it is dropped when t ends. It returns u rewritten
// to log in as it.
func loginRole(t *testing.T, u, member string) string {
	t.Helper()
	_, ru := newRole(t, u,
		`GRANT `+pgx.Identifier{member}.Sanitize()+` TO {role}`,
		`CREATE TABLE mine (id int PRIMARY KEY, v text, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('mine')`,
		`GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON mine TO {role}`)
	return ru
}

// newRole creates a login role (pgtest.LoginRole) and runs each statement
// of setup as u's user, with {role} replaced by the role's quoted name;
// the role, and everything it owns, is dropped when t ends. It returns the
// quoted name and u rewritten to log in as the role.
func newRole(t *testing.T, u string, setup ...string) (id, roleURL string) {
	t.Helper()
	name, roleURL := pgtest.LoginRole(t, u, "")
	id = pgx.Identifier{name}.Sanitize()
	admin := connect(t, u)
	for _, q := range setup {
		q = strings.ReplaceAll(q, "{role}", id)
		if _, err := admin.Exec(context.Background(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return id, roleURL
}

func sqlstateOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestRoles: the migration created both roles, NOLOGIN, the operator a
// member of the client.
func TestRoles(t *testing.T) {
	t.Parallel()
	conn := connect(t, pgtest.URL(t))
	var clientLogin, operatorLogin, member bool
	err := conn.QueryRow(context.Background(), `
SELECT c.rolcanlogin, o.rolcanlogin, pg_has_role(o.oid, c.oid, 'MEMBER')
  FROM pg_roles c, pg_roles o
 WHERE c.rolname = 'pgfence_client' AND o.rolname = 'pgfence_operator'`).Scan(&clientLogin, &operatorLogin, &member)
	if err != nil {
		t.Fatalf("roles: %v", err)
	}
	if clientLogin || operatorLogin || !member {
		t.Fatalf("client login %v, operator login %v, operator member of client %v; want false, false, true", clientLogin, operatorLogin, member)
	}
}

// TestClientRole: `GRANT pgfence_client TO app` is the whole setup. As a
// role with only that and DML on its own protected table, leases, lock keys
// and fenced writes work; writing pgfence.leases or the fence floor
// directly, bumping fences, force-releasing, and switching the guard off
// are refused.
func TestClientRole(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	app := connect(t, loginRole(t, u, "pgfence_client"))
	ctx := context.Background()

	var fence int64
	if err := app.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'app', 60000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatalf("try_acquire as pgfence_client: %v", err)
	}
	var until *time.Time
	if err := app.QueryRow(ctx, `SELECT pgfence.renew('job', 'app', $1, 60000000)`, fence).Scan(&until); err != nil || until == nil {
		t.Fatalf("renew as pgfence_client: %v, %v", until, err)
	}
	err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgfence.declare_token('job', $1)`, fence); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO mine (id, v) VALUES (1, 'fenced')`)
		return err
	})
	if err != nil {
		t.Fatalf("fenced write as pgfence_client: %v", err)
	}
	var key int64
	if err := app.QueryRow(ctx, `SELECT pgfence.lock_key('job')`).Scan(&key); err != nil {
		t.Fatalf("lock_key as pgfence_client: %v", err)
	}
	var n int
	if err := app.QueryRow(ctx, `SELECT count(*) FROM pgfence.lease_status`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("lease_status as pgfence_client: %d rows, %v", n, err)
	}
	var live *bool
	if err := app.QueryRow(ctx, `SELECT pgfence.release('job', 'app', $1)`, fence).Scan(&live); err != nil || live == nil || !*live {
		t.Fatalf("release as pgfence_client: %v, %v", live, err)
	}

	for _, q := range []string{
		`INSERT INTO pgfence.leases (name, owner, fence, expires_at) VALUES ('forged', 'x', 4611686018427387904, 'infinity')`,
		`UPDATE pgfence.leases SET fence = 4611686018427387904, expires_at = 'infinity'`,
		`UPDATE pgfence.leases SET owner = 'thief'`,
		`DELETE FROM pgfence.leases`,
		`TRUNCATE pgfence.leases`,
		`UPDATE pgfence.fence_floor SET floor = 0`,
		`SELECT floor FROM pgfence.fence_floor`,
		`SELECT pgfence.bump_fence(1000)`,
		`SELECT pgfence.force_release('job')`,
		`SELECT pgfence.grant_roles()`,
		`ALTER TABLE mine DISABLE TRIGGER pgfence_guard`,
		`DROP TRIGGER pgfence_guard ON mine`,
		`SET session_replication_role = replica`,
		`ALTER ROLE CURRENT_USER SET session_replication_role = replica`,
		`CREATE OR REPLACE FUNCTION pgfence.token_fence(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'`,
		`CREATE FUNCTION pgfence.x() RETURNS int LANGUAGE sql AS 'SELECT 1'`,
	} {
		_, err := app.Exec(ctx, q)
		if st := sqlstateOf(err); st != "42501" && st != "42883" {
			t.Errorf("%s as pgfence_client: %v, want insufficient_privilege (42501)", q, err)
		}
	}
	// And nothing changed.
	if err := app.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE owner IN ('x', 'thief') OR fence > 4000000000000000000`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("forged rows: %d, %v", n, err)
	}
}

// TestOperatorRole: pgfence_operator can do what a client can, plus
// force-release, bump fences and list unguarded tables.
func TestOperatorRole(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	op := connect(t, loginRole(t, u, "pgfence_operator"))
	ctx := context.Background()
	var fence int64
	if err := op.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'op', 60000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatalf("try_acquire as pgfence_operator: %v", err)
	}
	var live *bool
	if err := op.QueryRow(ctx, `SELECT pgfence.force_release('job')`).Scan(&live); err != nil || live == nil || !*live {
		t.Fatalf("force_release as pgfence_operator: %v, %v", live, err)
	}
	var floor int64
	if err := op.QueryRow(ctx, `SELECT pgfence.bump_fence(1000000)`).Scan(&floor); err != nil || floor <= fence {
		t.Fatalf("bump_fence as pgfence_operator: %d, %v (fence was %d)", floor, err, fence)
	}
	var next int64
	if err := op.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'op', 60000000) WHERE granted`).Scan(&next); err != nil || next <= floor {
		t.Fatalf("grant after bump: fence %d, %v; want above the floor %d", next, err, floor)
	}
	if _, err := op.Exec(ctx, `SELECT * FROM pgfence.unguarded()`); err != nil {
		t.Fatalf("unguarded as pgfence_operator: %v", err)
	}
}
