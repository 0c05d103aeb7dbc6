package fencing_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// wantCode fails t unless err carries a *pgconn.PgError with SQLSTATE code
// (or one of the codes separated by "|", where PostgreSQL releases differ).
func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !slices.Contains(strings.Split(code, "|"), pgErr.Code) {
		t.Fatalf("err = %v, want SQLSTATE %s", err, code)
	}
}

func TestProtectErrors(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, `CREATE TABLE no_fence (id int)`)
	mustExec(t, pool, `CREATE TABLE int_fence (id int, fence int)`)
	mustExec(t, pool, `CREATE TABLE text_fence (id int, fence text)`)
	mustExec(t, pool, `CREATE VIEW a_view AS SELECT 1::bigint AS fence`)
	mustExec(t, pool, `CREATE TABLE lower_case (fence bigint)`)
	// A generated column: the guard's stamp would be overwritten by the
	// expression after it, silently (migration 15).
	mustExec(t, pool, `CREATE TABLE generated_fence (id int, base bigint, fence bigint GENERATED ALWAYS AS (base) STORED)`)
	mustExec(t, pool, `CREATE TABLE inherits_generated (id int, base bigint, fence bigint NOT NULL DEFAULT 0)`)
	mustExec(t, pool, `CREATE TABLE generated_child (id int, base bigint NOT NULL, fence bigint NOT NULL GENERATED ALWAYS AS (base) STORED)`)
	// PostgreSQL 17 (not 15) refuses a generated child column under one
	// that is not (42804): the server closes that hole itself.
	cases := []struct{ table, code string }{
		{"inherits_generated", "42P16"}, // every table below it is checked
	}
	if _, err := pool.Exec(bg, `ALTER TABLE generated_child INHERIT inherits_generated`); err != nil {
		wantCode(t, err, "42804")
		cases = nil
	}
	for _, c := range append(cases, []struct{ table, code string }{
		{"no_fence", "42703"},
		{"int_fence", "42804"},
		{"text_fence", "42804"},
		{"generated_fence", "42P16"},
		{"a_view", "42809"},
		{"no_such_table", "42P01"},
		{"no_such_schema.lower_case", "3F000|42P01"}, // 42P01 from PostgreSQL 17 on
		{"LOWER_CASE", "42P01"},                      // names are exact, not case-folded
		{`"lower_case"`, "42P01"},                    // quotes are part of the name, not SQL syntax
	}...) {
		wantCode(t, fencing.Protect(bg, pool, c.table), c.code)
	}
	for _, table := range []string{"", ".", "a.", ".b", "a.b.c", strings.Repeat("x", 64), "nul\x00name", "bad\xffutf8", "public.bad\xff"} {
		if err := fencing.Protect(bg, pool, table); !errors.Is(err, fencing.ErrInvalid) {
			t.Errorf("Protect(%q) = %v, want ErrInvalid", table, err)
		}
	}
	for _, id := range []pgx.Identifier{nil, {"a", "b", "c"}, {""}, {"public", "a\xffb"}, {"\xfe", "t"}} {
		if err := fencing.ProtectIdentifier(bg, pool, id); !errors.Is(err, fencing.ErrInvalid) {
			t.Errorf("ProtectIdentifier(%q) = %v, want ErrInvalid", id, err)
		}
	}
	if err := fencing.Protect(bg, nil, "lower_case"); err == nil {
		t.Error("Protect with a nil db succeeded")
	}
	// None of the failures installed anything.
	var n int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM pg_trigger WHERE tgfoid = 'pgfence.fence_guard()'::regprocedure`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d guard triggers after failed Protect calls, want 0", n)
	}
}

func TestProtectWithoutSchema(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolFor(t, pgtest.EmptyURL(t))
	mustExec(t, pool, `CREATE TABLE t (fence bigint)`)
	err := fencing.Protect(bg, pool, "t")
	wantCode(t, err, "3F000")
	if !strings.Contains(err.Error(), "pgfence migrate up") {
		t.Fatalf("error %q does not say how to install pgfence", err)
	}
}

// TestProtectQuoting: weird names are protected exactly, and names built to
// inject SQL are just names that do not exist.
func TestProtectQuoting(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	mustExec(t, pool, `CREATE TABLE victim (id int)`)
	mustExec(t, pool, `CREATE SCHEMA "Odd ""Schema"""`)
	cases := []pgx.Identifier{
		{"Mixed Case"},
		{`we"ird`},
		{"semi;colon -- x"},
		{"dotted.name"},
		{"Odd \"Schema\"", "Ta\"ble'; DROP TABLE victim; --"},
		{"public", "ünïcode"},
	}
	for _, id := range cases {
		mustExec(t, pool, `CREATE TABLE `+id.Sanitize()+` (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`)
		var err error
		if strings.Contains(id[len(id)-1], ".") {
			err = fencing.ProtectIdentifier(bg, pool, id)
		} else {
			err = fencing.Protect(bg, pool, strings.Join(id, "."))
		}
		if err != nil {
			t.Fatalf("protect %s: %v", id.Sanitize(), err)
		}
		// Protected: a write without a token is rejected, one with a
		// token is stamped.
		_, err = pool.Exec(bg, `INSERT INTO `+id.Sanitize()+` (id) VALUES (1)`)
		wantNoToken(t, err)
		tok := grant(t, pool, "job", time.Minute)
		err = fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, `INSERT INTO `+id.Sanitize()+` (id) VALUES (1)`)
			return err
		})
		if err != nil {
			t.Fatalf("fenced insert into %s: %v", id.Sanitize(), err)
		}
		var fence int64
		if err := pool.QueryRow(bg, `SELECT fence FROM `+id.Sanitize()).Scan(&fence); err != nil || fence != tok.Fence {
			t.Fatalf("fence of %s = %d, %v; want %d", id.Sanitize(), fence, err, tok.Fence)
		}
		expire(t, pool, "job")
	}
	for _, evil := range []string{
		`victim; DROP TABLE victim; --`,
		`victim'); DROP TABLE victim; --`,
		`victim"; DROP TABLE victim; --`,
		`victim.x'::regclass); DROP TABLE victim; --`,
	} {
		err := fencing.Protect(bg, pool, evil)
		if err == nil {
			t.Fatalf("Protect(%q) succeeded", evil)
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) && !errors.Is(err, fencing.ErrInvalid) {
			t.Fatalf("Protect(%q) = %v", evil, err)
		}
	}
	mustExec(t, pool, `INSERT INTO victim VALUES (1)`) // still there, unprotected
	// Repeating Protect replaces the triggers rather than adding more.
	mustExec(t, pool, `CREATE TABLE again (fence bigint)`)
	for range 2 {
		if err := fencing.Protect(bg, pool, "public.again"); err != nil {
			t.Fatal(err)
		}
	}
	rows, _ := pool.Query(bg, `SELECT tgname FROM pg_trigger WHERE tgrelid = 'again'::regclass ORDER BY 1`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "pgfence_guard,pgfence_guard_truncate" {
		t.Fatalf("triggers on again = %v, want pgfence_guard, pgfence_guard_truncate", names)
	}
}
