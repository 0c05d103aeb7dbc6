package dbx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// dbQuerier is SQL over a *sql.DB, whose statements return when their
// context ends even if the driver does not end them: lib/pq on a silent
// network sends a cancel request and keeps reading, and the startup of a
// new connection ignores the context altogether. The statement then goes
// on in the background, on a connection of db's own, which database/sql
// gets back (or discards) when the driver returns; its results are
// dropped. Only a *sql.DB: a statement left running on a pinned
// *sql.Conn or *sql.Tx would hold up the next one on it anyway.
type dbQuerier struct{ q sqlQuerier }

// FailWait bounds how long pglock and leases wait for a statement they
// made fail (by closing its socket, or cancelling its context) before
// leaving it to end in the background: a closed socket (pgx) ends it at
// once, a driver that ignores its context (lib/pq on a silent network)
// may not for minutes.
const FailWait = time.Second

// outcome is what a statement run in the background gave.
type outcome[T any] struct {
	v   T
	err error
}

// bounded runs f in a goroutine of its own and returns its outcome, or
// ctx's error once ctx ends first; then drop receives the outcome when f
// returns, to release what it holds.
func bounded[T any](ctx context.Context, f func() (T, error), drop func(T)) (T, error) {
	if ctx.Done() == nil { // it never ends
		return f()
	}
	done := make(chan outcome[T], 1)
	go func() {
		v, err := f()
		done <- outcome[T]{v, err}
	}()
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		select {
		case o := <-done: // both at once
			return o.v, o.err
		default:
		}
		go func() {
			if o := <-done; drop != nil {
				drop(o.v)
			}
		}()
		var zero T
		return zero, ctx.Err()
	}
}

func (q dbQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return boundedRow{ctx: ctx, q: q.q, query: query, args: args}
}

// valued returns args with each driver.Valuer replaced by its value, read
// now: a statement left running in the background must not read a buffer
// its caller reuses (the keepalive's batches are).
func valued(args []any) ([]any, error) {
	out := make([]any, len(args))
	for i, a := range Args(args) {
		if v, ok := a.(driver.Valuer); ok {
			dv, err := v.Value()
			if err != nil {
				return nil, err
			}
			a = dv
		}
		out[i] = a
	}
	return out, nil
}

func (q dbQuerier) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	args, err := valued(args)
	if err != nil {
		return nil, err
	}
	return bounded(ctx, func() (pgx.Rows, error) { return q.q.Query(ctx, query, args...) },
		func(rs pgx.Rows) {
			if rs != nil {
				rs.Close()
			}
		})
}

func (q dbQuerier) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	args, err := valued(args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return bounded(ctx, func() (pgconn.CommandTag, error) { return q.q.Exec(ctx, query, args...) }, nil)
}

// boundedRow runs its statement when scanned, bounded by its context. The
// statement scans into copies of the destinations, copied into them only
// if it returns in time: one left running never writes the caller's.
type boundedRow struct {
	ctx   context.Context
	q     sqlQuerier
	query string
	args  []any
}

func (r boundedRow) Scan(dest ...any) error {
	if r.ctx.Done() == nil {
		return r.q.QueryRow(r.ctx, r.query, r.args...).Scan(dest...)
	}
	args, err := valued(r.args)
	if err != nil {
		return err
	}
	tmp := make([]any, len(dest))
	for i, d := range dest {
		if d != nil {
			tmp[i] = reflect.New(reflect.TypeOf(d).Elem()).Interface()
		}
	}
	_, err = bounded(r.ctx, func() (struct{}, error) {
		return struct{}{}, r.q.QueryRow(r.ctx, r.query, args...).Scan(tmp...)
	}, nil)
	if err != nil {
		return err
	}
	for i, d := range dest {
		if d != nil {
			reflect.ValueOf(d).Elem().Set(reflect.ValueOf(tmp[i]).Elem())
		}
	}
	return nil
}

// isDB reports whether h is a *sql.DB.
func isDB(h Handle) bool {
	_, ok := h.(*sql.DB)
	return ok
}
