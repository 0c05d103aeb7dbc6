package dbx

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// Querier runs statements: *pgxpool.Pool satisfies it, and SQL adapts a
// database/sql handle to it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Handle is what SQL adapts: *sql.DB, *sql.Conn and *sql.Tx have it.
type Handle interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// BackendPID returns the backend of the session q is pinned to (a
// *sql.Conn adapted by SQL): pgx knows it without asking, database/sql
// does not, and pglock and leases need it to cancel a wait or name what
// blocks it from another connection.
func BackendPID(ctx context.Context, q Querier) (uint32, error) {
	var pid uint32
	err := q.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
	return pid, err
}

// SQL returns h as a Querier. Over a *sql.DB each statement runs on a
// connection of its own, which database/sql never sends it again on, and
// returns when its context ends, whether or not the driver ends it
// (dbQuerier); LingeringOf counts those left running.
func SQL(h Handle) Querier {
	if db, ok := h.(*sql.DB); ok {
		return dbQuerier{db, new(Lingering)}
	}
	return sqlQuerier{h}
}

type sqlQuerier struct{ h Handle }

func (q sqlQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return row{q.h.QueryRowContext(ctx, query, Args(args)...)}
}

func (q sqlQuerier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	rs, err := q.h.QueryContext(ctx, query, Args(args)...)
	if err != nil {
		return nil, Error(err)
	}
	return &rows{rs: rs}, nil
}

func (q sqlQuerier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := q.h.ExecContext(ctx, query, Args(args)...)
	if err != nil {
		return pgconn.CommandTag{}, Error(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, Error(err)
	}
	return pgconn.NewCommandTag(fmt.Sprintf("SELECT %d", n)), nil
}

// row is a *sql.Row as a pgx.Row.
type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error {
	err := r.r.Scan(scanDests(dest)...)
	if errors.Is(err, sql.ErrNoRows) {
		return pgx.ErrNoRows
	}
	return Error(err)
}

// scanDests adapts dest to database/sql where pgx and database/sql
// differ: a nil destination, which pgx skips and database/sql refuses,
// becomes a throwaway one; a *json.RawMessage, which database/sql cannot
// set to NULL, is scanned through a *[]byte.
func scanDests(dest []any) []any {
	return replaced(dest, func(d any) (any, bool) {
		switch d := d.(type) {
		case nil:
			return new(any), true
		case *json.RawMessage:
			return (*[]byte)(d), true
		}
		return nil, false
	})
}

// replaced returns xs with each element that f replaces (ok) swapped for
// f's value, copying xs only if f replaces one: the caller's slice is
// never modified.
func replaced(xs []any, f func(x any) (any, bool)) []any {
	var out []any
	for i, x := range xs {
		y, ok := f(x)
		if !ok {
			continue
		}
		if out == nil {
			out = make([]any, len(xs))
			copy(out, xs)
		}
		out[i] = y
	}
	if out == nil {
		return xs
	}
	return out
}

// rows is a *sql.Rows as a pgx.Rows: enough for Next, Scan, Err, Close and
// pgx.CollectRows; FieldDescriptions, Values, RawValues, Conn and TypeMap report
// nothing.
type rows struct {
	rs   *sql.Rows
	err  error
	n    int64
	done func() // if not nil, gives back the connection rs was read from
}

func (r *rows) Close() {
	if err := r.rs.Close(); err != nil && r.err == nil {
		r.err = Error(err)
	}
	if r.done != nil {
		r.done()
		r.done = nil
	}
}

func (r *rows) Err() error {
	if r.err != nil {
		return r.err
	}
	return Error(r.rs.Err())
}

func (r *rows) CommandTag() pgconn.CommandTag {
	return pgconn.NewCommandTag(fmt.Sprintf("SELECT %d", r.n))
}

func (r *rows) FieldDescriptions() []pgconn.FieldDescription { return nil }

func (r *rows) Next() bool {
	if r.rs.Next() {
		r.n++
		return true
	}
	r.Close()
	return false
}

func (r *rows) Scan(dest ...any) error {
	if err := r.rs.Scan(scanDests(dest)...); err != nil {
		r.err = Error(err)
		return r.err
	}
	return nil
}

func (r *rows) Values() ([]any, error) { return nil, errors.New("dbx: Values is not supported") }
func (r *rows) RawValues() [][]byte    { return nil }
func (r *rows) Conn() *pgx.Conn        { return nil }
func (r *rows) TypeMap() *pgtype.Map   { return nil }

// Args returns args with each Go slice that lib/pq cannot bind ([]string,
// []int64, []int32) replaced by its PostgreSQL array literal. args itself
// is not modified.
func Args(args []any) []any {
	return replaced(args, func(a any) (any, bool) {
		switch v := a.(type) {
		case []string:
			return textArray(v), true
		case []int64:
			return intArray(v), true
		case []int32:
			return intArray(v), true
		}
		return nil, false
	})
}

// textArray renders ss as a text[] literal: each element double-quoted,
// with backslash and double quote escaped by a backslash, so that no
// element is read as NULL, split at a comma or trimmed.
func textArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func intArray[T int32 | int64](ns []T) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, n)
	}
	b.WriteByte('}')
	return b.String()
}

// IsNil reports whether v is nil or a typed nil pointer in an interface (a
// nil *pgxpool.Tx as a pgx.Tx, a nil *sql.DB as a handle), which would
// otherwise panic inside the driver.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}
