package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestTableOwnerProtects (scenario: the application role owns its tables,
// and another role ran pgfence's migrations). A table's owner that is a
// pgfence_client protects its table itself, as docs/operators.md says, and
// writes it only with a token; an owner without pgfence_client cannot.
func TestTableOwnerProtects(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	_, appURL := newRole(t, u, `GRANT pgfence_client TO {role}`, `GRANT CREATE ON SCHEMA public TO {role}`)
	app := connect(t, appURL)
	for _, q := range []string{
		`CREATE TABLE owned (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('owned')`,
	} {
		if _, err := app.Exec(ctx, q); err != nil {
			t.Fatalf("%s, as the table's owner and a pgfence_client: %v", q, err)
		}
	}
	if _, err := app.Exec(ctx, `INSERT INTO owned VALUES (1)`); sqlstateOf(err) != "PF002" {
		t.Fatalf("unfenced write to the protected table: %v, want PF002", err)
	}
	var fence int64
	if err := app.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'app', 60000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CALL pgfence.declare('job', $1)`, fence); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO owned VALUES (1)`)
		return err
	})
	if err != nil {
		t.Fatalf("fenced write: %v", err)
	}

	_, otherURL := newRole(t, u, `GRANT CREATE ON SCHEMA public TO {role}`)
	other := connect(t, otherURL)
	if _, err := other.Exec(ctx, `CREATE TABLE other_owned (id int, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `SELECT pgfence.protect('other_owned')`); sqlstateOf(err) != "42501" {
		t.Fatalf("protect as an owner without pgfence_client: %v, want insufficient_privilege (42501)", err)
	}
}

// TestColumnGrantsRevoked (scenario: before migration 4, an operator gave a
// role column-level UPDATE on pgfence.leases, as a narrower version of
// what version 3's README told them to grant). After the migrations the
// role can no longer write the lease table: with it, it could forge a
// grant or set a fence back.
func TestColumnGrantsRevoked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.EmptyURL(t)
	admin := connect(t, u)
	upTo(t, ctx, admin, 3) // as the migrations of version 3 left it
	_, legacyURL := newRole(t, u,
		`GRANT USAGE ON SCHEMA pgfence TO {role}`,
		`GRANT SELECT, INSERT (name, owner, fence, expires_at), UPDATE (fence, owner, expires_at), REFERENCES (name) ON pgfence.leases TO {role}`)
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	var left []string
	rows, err := admin.Query(ctx, `SELECT a.privilege_type || ' (' || att.attname || ') to ' || a.grantee::regrole
  FROM pg_attribute AS att, aclexplode(att.attacl) AS a
 WHERE att.attrelid = 'pgfence.leases'::regclass AND a.privilege_type <> 'SELECT'`)
	if err == nil {
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Errorf("column write privileges left on pgfence.leases: %v", left)
	}
	legacy := connect(t, legacyURL)
	for _, q := range []string{
		`UPDATE pgfence.leases SET fence = 1, owner = 'thief', expires_at = 'infinity'`,
		`INSERT INTO pgfence.leases (name, owner, fence, expires_at) VALUES ('forged', 'thief', 1, 'infinity')`,
	} {
		if _, err := legacy.Exec(ctx, q); sqlstateOf(err) != "42501" {
			t.Errorf("%s after the migrations: %v, want insufficient_privilege (42501)", q, err)
		}
	}
}
