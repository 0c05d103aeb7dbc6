package dbx_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func open(t *testing.T) dbx.Querier {
	t.Helper()
	db, err := sql.Open("pgx", pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return dbx.SQL(db)
}

// Slices travel as array literals that PostgreSQL reads back unchanged,
// whatever their elements hold.
func TestArgsRoundTrip(t *testing.T) {
	t.Parallel()
	q := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	texts := []string{"", "a", "NULL", "null", `"quoted"`, `back\slash`, "a,b", "{x}", " padded ", "é\tü\n"}
	var n int
	var joined string
	err := q.QueryRow(ctx, `SELECT cardinality($1::text[]), array_to_string($1::text[], '|')`, texts).Scan(&n, &joined)
	want := ""
	for i, s := range texts {
		if i > 0 {
			want += "|"
		}
		want += s
	}
	if err != nil || n != len(texts) || joined != want {
		t.Fatalf("text[]: %d %q %v; want %d %q", n, joined, err, len(texts), want)
	}
	ints := []int64{-9223372036854775808, 0, 9223372036854775807}
	var sum string
	if err := q.QueryRow(ctx, `SELECT (SELECT string_agg(k::text, ',') FROM unnest($1::int8[]) AS k)`, ints).Scan(&sum); err != nil || sum != "-9223372036854775808,0,9223372036854775807" {
		t.Fatalf("int8[]: %q %v", sum, err)
	}
	var c int
	if err := q.QueryRow(ctx, `SELECT cardinality($1::int4[])`, []int32{1, 2}).Scan(&c, nil); err == nil {
		t.Fatal("Scan of one column into two destinations succeeded")
	}
	if err := q.QueryRow(ctx, `SELECT cardinality($1::int4[]), 'ignored'`, []int32{1, 2}).Scan(&c, nil); err != nil || c != 2 {
		t.Fatalf("int4[] with a nil destination: %d %v", c, err)
	}
	in := []any{texts}
	_ = dbx.Args(in)
	if !slices.Equal(in[0].([]string), texts) {
		t.Fatal("Args modified its argument")
	}
}

type pqLike struct{ code string }

func (e *pqLike) Error() string    { return "pq: " + e.code }
func (e *pqLike) SQLState() string { return e.code }

// A driver's error with a SQLSTATE reads as a *pgconn.PgError and stays in
// the chain; no rows is pgx.ErrNoRows.
func TestErrors(t *testing.T) {
	t.Parallel()
	orig := fmt.Errorf("exec: %w", &pqLike{code: "PF001"})
	err := dbx.Error(orig)
	var pg *pgconn.PgError
	var pq *pqLike
	if !errors.As(err, &pg) || pg.Code != "PF001" || !errors.As(err, &pq) || dbx.SQLState(orig) != "PF001" {
		t.Fatalf("Error(%v): PgError %v, driver error %v", orig, pg, pq)
	}
	if dbx.Error(nil) != nil || dbx.SQLState(errors.New("plain")) != "" {
		t.Fatal("nil or a plain error changed")
	}
	q := open(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := q.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(new(int)); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("no rows: %v", err)
	}
	if _, err := q.Exec(ctx, `SELECT 1/0`); dbx.SQLState(err) != "22012" {
		t.Fatalf("division by zero: %v", err)
	}
}
