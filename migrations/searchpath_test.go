package migrations_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestHostileSearchPath: a writer whose search_path puts a schema of
// look-alikes before pg_catalog — operators, functions and a type named as
// the built-ins that the token declaration and the guard use, each raising
// "hijacked" — still declares, writes and is rejected exactly as with the
// default path. declare_token (migration 8) and the guard (migration 9),
// which run as their caller without a search_path of their own, name
// everything schema-qualified.
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
		`CREATE FUNCTION evil.eq(pg_catalog.text, pg_catalog.text) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.add(int, int) RETURNS int LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.gt(timestamptz, timestamptz) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.ne(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.field(jsonb, pg_catalog.text) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE OPERATOR evil.= (LEFTARG = pg_catalog.text, RIGHTARG = pg_catalog.text, FUNCTION = evil.eq)`,
		`CREATE OPERATOR evil.+ (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.add)`,
		`CREATE OPERATOR evil.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = evil.gt)`,
		`CREATE OPERATOR evil.<> (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = evil.ne)`,
		`CREATE OPERATOR evil.->> (LEFTARG = jsonb, RIGHTARG = pg_catalog.text, FUNCTION = evil.field)`,
		`CREATE FUNCTION evil.length(pg_catalog.text) RETURNS int LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.substr(pg_catalog.text, int) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.left(pg_catalog.text, int) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.translate(pg_catalog.text, pg_catalog.text, pg_catalog.text) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.hashtext(pg_catalog.text) RETURNS int LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.format(pg_catalog.text, bigint, bigint, name, name) RETURNS pg_catalog.text LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.to_jsonb(anyelement) RETURNS jsonb LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.jsonb_build_object(pg_catalog.text, bigint) RETURNS jsonb LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE FUNCTION evil.jsonb_populate_record(anyelement, jsonb) RETURNS anyelement LANGUAGE plpgsql AS $$` + fail + `$$`,
		`CREATE TABLE public.other (id int PRIMARY KEY, v text, epoch bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('public.other', 'epoch')`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON public.other TO PUBLIC`,
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
	// Each way of declaring in turn (migration 12's procedure as well), on
	// emptied tables; the admin empties them as a replica, which the guard
	// lets through.
	for _, c := range []struct{ name, declare string }{
		{"declare_token", `SELECT pgfence.declare_token('job', $1)`},
		{"declare", `CALL pgfence.declare('job', $1)`},
	} {
		t.Run(c.name, func(t *testing.T) { hostileWrites(t, admin, app, fence, c.declare) })
	}
}

// hostileWrites is TestHostileSearchPath's check, with one way of declaring:
// app's search_path is hostile, and it holds the lease "job" at fence.
func hostileWrites(t *testing.T, admin, app *pgx.Conn, fence int64, declare string) {
	t.Helper()
	ctx := context.Background()
	if _, err := admin.Exec(ctx, `SET session_replication_role = replica; DELETE FROM public.mine; DELETE FROM public.other; RESET session_replication_role`); err != nil {
		t.Fatal(err)
	}
	write := func(fence int64, q string) error {
		return pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, declare, fence); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, q)
			return err
		})
	}
	// public.other's fence column is "epoch": the guard's jsonb path.
	for _, table := range []string{"public.mine", "public.other"} {
		for _, q := range []string{
			`INSERT INTO ` + table + ` (id, v) VALUES (1, 'a'), (2, 'a')`,
			`UPDATE ` + table + ` SET v = 'b'`,
			`DELETE FROM ` + table + ` WHERE id = 2`,
		} {
			if err := write(fence, q); err != nil {
				t.Fatalf("fenced %q under a hostile search_path: %v", q, err)
			}
		}
		for _, q := range []string{`UPDATE ` + table + ` SET v = 'c'`, `DELETE FROM ` + table} {
			if err := write(fence-1, q); sqlstateOf(err) != "PF001" || strings.Contains(err.Error(), "hijacked") {
				t.Fatalf("stale %q under a hostile search_path: %v, want PF001", q, err)
			}
		}
	}
	err := write(fence+1, `UPDATE public.mine SET v = 'c'`)
	if st := sqlstateOf(err); st != "PF001" || strings.Contains(err.Error(), "hijacked") {
		t.Fatalf("UPDATE with a fence not granted under a hostile search_path: %v, want PF001", err)
	}
	if err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE public.mine SET v = 'c'`)
		return err
	}); sqlstateOf(err) != "PF002" || strings.Contains(err.Error(), "hijacked") {
		t.Fatalf("undeclared UPDATE under a hostile search_path: %v, want PF002", err)
	}
	err = write(0, `UPDATE public.mine SET v = 'c'`)
	if st := sqlstateOf(err); st != "PF002" || strings.Contains(err.Error(), "hijacked") {
		t.Fatalf("declaring fence 0 under a hostile search_path: %v, want PF002", err)
	}
	for _, table := range []string{"public.mine", "public.other"} {
		var rows string
		if err := app.QueryRow(ctx, `SELECT string_agg(id || v, ',') FROM `+table).Scan(&rows); err != nil || rows != "1b" {
			t.Fatalf("%s holds %q, %v; want 1b", table, rows, err)
		}
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
		{"declare", "READ COMMITTED", `CALL pgfence.declare('job', $1)`, "42501"},
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

// TestMigrationRoleSearchPath (scenario: PostgreSQL 14, where every role
// may create objects in schema public, which is on the migration role's
// search path; an operator of version 3 granted an application role
// SELECT and UPDATE on pgfence.leases, as version 3's README said). A
// role with no privileges puts an operator for oid <> integer in public:
// a better match than pg_catalog's oid <> oid for migration 4's
// "a.grantee <> 0", so the files would run it as the migration role, a
// superuser here. Up runs the files with a search path of pg_catalog
// only, and the look-alike never runs.
func TestMigrationRoleSearchPath(t *testing.T) {
	t.Parallel()
	ctx, u, admin := publicWritable(t)
	upTo(t, ctx, admin, 3)
	newRole(t, u, `GRANT USAGE ON SCHEMA pgfence TO {role}`, `GRANT SELECT, UPDATE ON pgfence.leases TO {role}`)
	hostileID, hostileURL := newRole(t, u)
	hostile := connect(t, hostileURL)
	escalate := `LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = current_user) THEN
        EXECUTE 'ALTER ROLE ` + strings.ReplaceAll(hostileID, "'", "''") + ` SUPERUSER';
    END IF;
    RETURN true;
END $$`
	for _, q := range []string{
		`CREATE FUNCTION public.ne(oid, integer) RETURNS boolean ` + escalate,
		`CREATE FUNCTION public.eq(oid, integer) RETURNS boolean ` + escalate,
		`CREATE OPERATOR public.<> (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.ne)`,
		`CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.eq)`,
	} {
		if _, err := hostile.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up: %v", err)
	}
	var super bool
	if err := admin.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE oid = $1::regrole`, hostileID).Scan(&super); err != nil {
		t.Fatal(err)
	}
	if super {
		t.Error("the migrations ran a look-alike operator of an unprivileged role as the migration role: that role is a superuser now")
	}
	if bound := boundToRole(t, admin, hostileID); len(bound) != 0 {
		t.Errorf("pgfence's objects use the look-alike operators, and run them as whoever calls them: %v", bound)
	}
}

// boundToRole lists the objects that depend on an operator or function
// role owns: a SQL function body or view bound to a look-alike.
func boundToRole(t *testing.T, conn *pgx.Conn, role string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' uses ' || pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
  FROM pg_depend AS d
 WHERE (d.refclassid = 'pg_operator'::regclass AND d.refobjid IN (SELECT oid FROM pg_operator WHERE oprowner = $1::regrole))
    OR (d.refclassid = 'pg_proc'::regclass AND d.refobjid IN (SELECT oid FROM pg_proc WHERE proowner = $1::regrole))
 ORDER BY 1`, role)
	if err != nil {
		t.Fatal(err)
	}
	bound, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var ours []string
	for _, b := range bound {
		if strings.Contains(b, "pgfence.") {
			ours = append(ours, b)
		}
	}
	return ours
}

// TestUpRebindsLookAlikes (scenario: a database migrated before the runner
// pinned the search path, or by golang-migrate's CLI, where an
// unprivileged role had put look-alikes of built-ins in public). The SQL
// bodies that were parsed then stay bound to them, to run as whoever
// calls them: lock_key's convert_to under release, a SECURITY DEFINER
// function. Up re-creates them bound to pg_catalog's.
func TestUpRebindsLookAlikes(t *testing.T) {
	t.Parallel()
	ctx, u, admin := publicWritable(t)
	hostileID, hostileURL := newRole(t, u)
	hostile := connect(t, hostileURL)
	for _, q := range []string{
		`CREATE FUNCTION public.convert_to(text, text) RETURNS bytea LANGUAGE sql AS 'SELECT pg_catalog.convert_to($1, $2::name)'`,
		`CREATE FUNCTION public.concat_ws(text, text, text) RETURNS text LANGUAGE sql AS 'SELECT pg_catalog.concat_ws($1, $2, $3)'`,
		`CREATE FUNCTION public.eq(oid, integer) RETURNS boolean LANGUAGE sql AS 'SELECT $1 OPERATOR(pg_catalog.=) $2::oid'`,
		`CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.eq)`,
	} {
		if _, err := hostile.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	upTo(t, ctx, admin, 15) // as the runner of version 15 left it
	if bound := boundToRole(t, admin, hostileID); len(bound) == 0 {
		t.Fatal("precondition: migrations 1 to 15, run with the look-alikes on the path, bound nothing to them")
	}
	var before int64
	if err := admin.QueryRow(ctx, `SELECT pgfence.lock_key('billing')`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up: %v", err)
	}
	if bound := boundToRole(t, admin, hostileID); len(bound) != 0 {
		t.Errorf("after Up, pgfence's objects still use the look-alikes: %v", bound)
	}
	var after int64
	if err := admin.QueryRow(ctx, `SELECT pgfence.lock_key('billing')`).Scan(&after); err != nil || after != before {
		t.Errorf("lock_key('billing') = %d, %v after Up; want %d as before", after, err, before)
	}
}

// publicWritable returns a new empty database where every role may create
// objects in schema public, as in PostgreSQL 14 and before, with a context
// for the test and a connection of the database's owner.
func publicWritable(t *testing.T) (context.Context, string, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	u := pgtest.EmptyURL(t)
	admin := connect(t, u)
	if _, err := admin.Exec(ctx, `GRANT CREATE ON SCHEMA public TO PUBLIC`); err != nil { // PostgreSQL 14's default
		t.Fatal(err)
	}
	return ctx, u, admin
}
