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

// dbQuerier is SQL over a *sql.DB. Each statement runs on a connection of
// its own (DB.Conn), not on db: on db, database/sql sends a statement again
// when the driver answers driver.ErrBadConn, and lib/pq answers it for any
// connection that broke, after the statement was sent too (lib/pq issue
// 939). A statement sent twice reads its own first copy's effect: a grant
// finds the lease held by the first, under its own owner, and a release
// finds the grant it ended already gone. On a connection of its own the
// statement fails instead. Getting the connection still passes over those
// the driver knows to be bad.
//
// Its statements return when their context ends even if the driver does
// not end them: lib/pq on a silent network sends a cancel request and
// keeps reading, and the startup of a new connection ignores the context
// altogether. The statement then goes on in the background, on its
// connection, which database/sql gets back (or discards) when the driver
// returns; its results are dropped. Only a *sql.DB: a statement left
// running on a pinned *sql.Conn or *sql.Tx would hold up the next one on
// it anyway.
type dbQuerier struct {
	db        *sql.DB
	lingering *Lingering // its statements left running
}

// conn returns a connection of q's own for one statement, adapted, and
// the function that gives it back.
func (q dbQuerier) conn(ctx context.Context) (sqlQuerier, func(), error) {
	sc, err := q.db.Conn(ctx)
	if err != nil {
		return sqlQuerier{}, nil, Error(err)
	}
	return sqlQuerier{sc}, func() { _ = sc.Close() }, nil
}

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

// bounded runs f in a goroutine of its own, counted in g, and returns its
// outcome, or ctx's error once ctx ends first; then drop receives the
// outcome when f returns, to release what it holds, in the same goroutine.
func bounded[T any](ctx context.Context, g *Lingering, f func() (T, error), drop func(T)) (T, error) {
	if ctx.Done() == nil { // it never ends
		return f()
	}
	done := make(chan outcome[T])
	left := make(chan struct{}) // closed when the caller has returned without the outcome
	g.Go(func() {
		v, err := f()
		select {
		case done <- outcome[T]{v, err}:
		case <-left:
			if drop != nil {
				drop(v)
			}
		}
	})
	select {
	case o := <-done:
		return o.v, o.err
	case <-ctx.Done():
		select {
		case o := <-done: // both at once
			return o.v, o.err
		default:
		}
		close(left)
		var zero T
		return zero, ctx.Err()
	}
}

func (q dbQuerier) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return boundedRow{ctx: ctx, q: q, query: query, args: args}
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
	return bounded(ctx, q.lingering, func() (pgx.Rows, error) {
		sq, done, err := q.conn(ctx)
		if err != nil {
			return nil, err
		}
		rs, err := sq.Query(ctx, query, args...)
		if err != nil {
			done()
			return nil, err
		}
		rs.(*rows).done = done
		return rs, nil
	},
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
	return bounded(ctx, q.lingering, func() (pgconn.CommandTag, error) {
		sq, done, err := q.conn(ctx)
		if err != nil {
			return pgconn.CommandTag{}, err
		}
		defer done()
		return sq.Exec(ctx, query, args...)
	}, nil)
}

// boundedRow runs its statement when scanned, bounded by its context. The
// statement scans into copies of the destinations, copied into them only
// if it returns in time: one left running never writes the caller's.
type boundedRow struct {
	ctx   context.Context
	q     dbQuerier
	query string
	args  []any
}

func (r boundedRow) Scan(dest ...any) error {
	if r.ctx.Done() == nil {
		return r.scan(r.args, dest)
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
	_, err = bounded(r.ctx, r.q.lingering, func() (struct{}, error) { return struct{}{}, r.scan(args, tmp) }, nil)
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

// scan runs the statement with args on a connection of its own and scans
// its row into dest.
func (r boundedRow) scan(args, dest []any) error {
	sq, done, err := r.q.conn(r.ctx)
	if err != nil {
		return err
	}
	defer done()
	return sq.QueryRow(r.ctx, r.query, args...).Scan(dest...)
}
