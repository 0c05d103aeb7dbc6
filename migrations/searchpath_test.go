package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestHostileSearchPath: a writer whose search_path puts a schema of
// look-alikes before pg_catalog — operators, functions and a type named as
// the built-ins that the token declaration and the guard use, each raising
// "hijacked" — still declares, writes and is rejected exactly as with the
// default path. The guard pins its search_path; declare_token, which runs
// as its caller without one (migration 8), names everything
// schema-qualified.
func TestHostileSearchPath(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	ctx := context.Background()
	admin := connect(t, u)
	const fail = `BEGIN RAISE EXCEPTION 'hijacked'; END`
	for _, q := range []string{
		`CREATE SCHEMA evil`,
		`GRANT USAGE ON SCHEMA evil TO PUBLIC`,
		`CREATE DOMAIN evil.text AS pg_catalog.text CHECK (false)`,
		`CREATE FUNCTION evil.lt(int, int) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.lt(bigint, int) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.lt(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.ne(pg_catalog.text, pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE OPERATOR evil.< (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.lt)`,
		`CREATE OPERATOR evil.> (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.lt)`,
		`CREATE OPERATOR evil.< (LEFTARG = bigint, RIGHTARG = int, FUNCTION = evil.lt)`,
		`CREATE OPERATOR evil.< (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.lt)`,
		`CREATE OPERATOR evil.<> (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text, FUNCTION = evil.ne)`,
		`CREATE FUNCTION evil.octet_length(pg_catalog.text) RETURNS int LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.set_config(pg_catalog.text, pg_catalog.text, boolean) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.pg_current_xact_id() RETURNS xid8 LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.current_setting(pg_catalog.text, boolean) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.split_part(pg_catalog.text, pg_catalog.text, int) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.pg_advisory_xact_lock_shared(int, int) RETURNS void LANGUAGE plpgsql AS $$` + fail + `$$`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	app := connect(t, loginRole(t, u, "pgfence_client"))
	var fence int64
	if err := app.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'app', 60000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Exec(ctx, `SET search_path = evil, pg_catalog, public`); err != nil {
		t.Fatal(err)
	}
	write := func(fence int64, q string) error {
		return pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pgfence.declare_token('job', $1)`, fence); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, q)
			return err
		})
	}
	if err := write(fence, `INSERT INTO public.mine (id, v) VALUES (1, 'a')`); err != nil {
		t.Fatalf("fenced INSERT under a hostile search_path: %v", err)
	}
	if err := write(fence, `UPDATE public.mine SET v = 'b'`); err != nil {
		t.Fatalf("fenced UPDATE under a hostile search_path: %v", err)
	}
	err := write(fence-1, `UPDATE public.mine SET v = 'c'`)
	if st := sqlstateOf(err); st != "PF001" {
		t.Fatalf("stale UPDATE under a hostile search_path: %v, want PF001", err)
	}
	err = write(0, `UPDATE public.mine SET v = 'c'`)
	if st := sqlstateOf(err); st != "PF002" || strings.Contains(err.Error(), "hijacked") {
		t.Fatalf("declaring fence 0 under a hostile search_path: %v, want PF002", err)
	}
	var v string
	if err := app.QueryRow(ctx, `SELECT v FROM public.mine WHERE id = 1`).Scan(&v); err != nil || v != "b" {
		t.Fatalf("row = %q, %v; want b", v, err)
	}
}

// TestWriterWithoutClientRole: a role that may write a protected table but
// lacks pgfence_client writes nothing, whatever it declares: the guard
// reads the lease with the writer's privileges (migration 8) or, under
// REPEATABLE READ, calls token_fence, which it may not execute.
func TestWriterWithoutClientRole(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	ctx := context.Background()
	admin := connect(t, u)
	var fence int64
	if err := admin.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'app', 60000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	app := connect(t, loginRole(t, u, "pg_read_all_settings")) // a member of nothing pgfence grants to
	forge := `SELECT set_config('pgfence.token', pg_current_xact_id()::text || ':' || $1::bigint || ':job', true)`
	for _, c := range []struct {
		what, iso, declare, want string
	}{
		{"no declaration", "READ COMMITTED", "", "PF002"},
		{"declare_token", "READ COMMITTED", `SELECT pgfence.declare_token('job', $1)`, "42501"},
		{"forged declaration", "READ COMMITTED", forge, "42501"},
		{"forged declaration", "REPEATABLE READ", forge, "42501"},
	} {
		err := pgx.BeginTxFunc(ctx, app, pgx.TxOptions{IsoLevel: pgx.TxIsoLevel(c.iso)}, func(tx pgx.Tx) error {
			if c.declare != "" {
				if _, err := tx.Exec(ctx, c.declare, fence); err != nil {
					return err
				}
			}
			_, err := tx.Exec(ctx, `INSERT INTO mine (id, v) VALUES (1, 'x')`)
			return err
		})
		if st := sqlstateOf(err); st != c.want {
			t.Errorf("%s under %s: %v, want SQLSTATE %s", c.what, c.iso, err, c.want)
		}
	}
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM mine`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written: %d, %v", n, err)
	}
}
