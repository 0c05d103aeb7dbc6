package fencing

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/dbx"
)

// lazyTx is the transaction InTx hands fn over a *pgxpool.Pool,
// *pgxpool.Conn or *pgx.Conn: it sends nothing until fn's first call. A
// first Exec or QueryRow with arguments goes in one pipelined batch with
// BEGIN and the declaration (pgx.Batch.BeginTx), so the usual fenced write
// — one statement, then COMMIT — takes two round trips, as many as the
// statement and COMMIT alone; any other first call begins as Begin does.
// From then on every call goes to the pgx.Tx that began.
//
// A lazyTx is not safe for concurrent use, as no pgx.Tx is.
type lazyTx struct {
	ctx     context.Context // InTx's: bounds a begin that Conn or LargeObjects causes
	tok     Token
	conn    *pgx.Conn
	release func() // gives a pool's connection back; nil for the caller's own
	tx      pgx.Tx // once begun
	err     error  // the failed begin's error, which InTx returns
	closed  bool   // committed, rolled back or ended by InTx
}

// lazyBeginner reports whether db is a handle lazyTx can run on: one that
// can send a batch beginning a transaction (not a pgx.Tx, whose Begin
// opens a savepoint).
func lazyBeginner(db DB) bool {
	switch db.(type) {
	case *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn:
		return true
	}
	return false
}

// newLazyTx returns a lazyTx on db (see lazyBeginner), acquiring a pool's
// connection first.
func newLazyTx(ctx context.Context, db DB, tok Token) (*lazyTx, error) {
	lt := &lazyTx{ctx: ctx, tok: tok, conn: connOf(db)}
	if p, ok := db.(*pgxpool.Pool); ok {
		pc, err := p.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("fencing: begin: %w", err)
		}
		lt.conn, lt.release = pc.Conn(), pc.Release
	}
	return lt, nil
}

// errAlone is what send returns when nothing ran.
var errAlone = errors.New("fencing: the statement was not sent")

// send sends BEGIN, the declaration and fn's first statement, sql with
// args, in one batch, and returns the batch's results with the first two
// read: the statement's are next. It returns errAlone if nothing ran — the
// server could not prepare the statement, or the connection's mode could
// not send the batch: the caller begins as Begin does and sends the
// statement alone, for the error, and the transaction's state, that it
// would have had. An argument pgx cannot encode is the exception: pgx
// closes the connection, which ends the transaction.
func (lt *lazyTx) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(sqlDeclareToken, lt.tok.Lease, lt.tok.Fence)
	b.Queue(sql, args...)
	br := lt.conn.SendBatch(ctx, &b)
	tx := br.Tx()
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		lt.tx = tx
		return br, nil
	}
	_ = br.Close() // the begin's or declaration's failure matters more
	var pre pgx.ErrPreprocessingBatch
	mine := errors.As(err, &pre) && pre.SQL() == sql // fn's statement could not be sent
	switch {
	case mine && lt.conn.IsClosed():
		// pgx closes the connection when it cannot encode an argument of
		// a batch's later query: the transaction is lost with it.
		lt.err = pre.Unwrap()
		return nil, lt.err
	case lt.conn.PgConn().TxStatus() == 'I' && !lt.conn.IsClosed() && ctx.Err() == nil &&
		(mine || dbx.PgError(err) == nil):
		return nil, errAlone
	}
	rollback(ctx, tx)
	lt.err = fmt.Errorf("fencing: begin with token %v%s: %w", lt.tok, notMigrated(err), classify(lt.tok, err))
	return nil, lt.err
}

// begun returns the transaction, beginning it as Begin does if fn has not
// yet made a call; the error is ErrTxClosed after the end, and the failed
// begin's error after one.
func (lt *lazyTx) begun(ctx context.Context) (pgx.Tx, error) {
	switch {
	case lt.closed:
		return nil, pgx.ErrTxClosed
	case lt.err != nil:
		return nil, lt.err
	case lt.tx == nil:
		tx, err := Begin(ctx, lt.conn, lt.tok)
		if err != nil {
			lt.err = err
			return nil, err
		}
		lt.tx = tx
	}
	return lt.tx, nil
}

// done closes lt for good, whatever fn left it in, and gives a pool's
// connection back (a pool destroys one left inside a transaction); InTx
// calls it once, after committing or rolling back.
func (lt *lazyTx) done() {
	lt.closed = true
	if lt.release != nil {
		lt.release()
		lt.release = nil
	}
}

// pending reports whether fn's call with args rides with BEGIN: nothing
// has begun or failed yet, and rides(args).
func (lt *lazyTx) pending(args []any) bool {
	return lt.tx == nil && !lt.closed && lt.err == nil && rides(args)
}

// Exec runs sql; the first call with arguments rides with BEGIN.
func (lt *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if lt.pending(args) {
		br, err := lt.send(ctx, sql, args)
		if err == nil {
			tag, err := br.Exec()
			if cerr := br.Close(); err == nil {
				err = cerr
			}
			return tag, err
		}
		if err != errAlone {
			return pgconn.CommandTag{}, err
		}
	}
	tx, err := lt.begun(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return tx.Exec(ctx, sql, args...)
}

// rides reports whether fn's first Exec or QueryRow with args can ride in
// the batch: it has arguments (without them pgx sends a statement by the
// simple protocol, which may hold several statements that a batch would
// refuse) and does not start with an option a batch does not take.
func rides(args []any) bool {
	if len(args) == 0 {
		return false
	}
	switch args[0].(type) {
	case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
		return false
	}
	return true
}

// Query begins first if need be.
func (lt *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := lt.begun(ctx)
	if err != nil {
		return failed(err).Query()
	}
	return tx.Query(ctx, sql, args...)
}

// QueryRow runs sql; the first call with arguments rides with BEGIN.
func (lt *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if lt.pending(args) {
		br, err := lt.send(ctx, sql, args)
		if err == nil {
			return batchRow{br.QueryRow(), br}
		}
		if err != errAlone {
			return failed(err).QueryRow()
		}
	}
	tx, err := lt.begun(ctx)
	if err != nil {
		return failed(err).QueryRow()
	}
	return tx.QueryRow(ctx, sql, args...)
}

// SendBatch begins first if need be.
func (lt *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := lt.begun(ctx)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	return tx.SendBatch(ctx, b)
}

// CopyFrom begins first if need be.
func (lt *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := lt.begun(ctx)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

// Prepare begins first if need be.
func (lt *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := lt.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Prepare(ctx, name, sql)
}

// Begin opens a savepoint, beginning first if need be.
func (lt *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := lt.begun(ctx)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

// LargeObjects begins first, within InTx's context, if need be; after a
// failed begin, its calls fail with ErrTxClosed (and InTx returns the
// begin's error).
func (lt *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := lt.begun(lt.ctx)
	if err != nil {
		var b pgx.Batch
		b.BeginTx(pgx.TxOptions{})
		return pgx.FailedBatchResults(&b, err).Tx().LargeObjects()
	}
	return tx.LargeObjects()
}

// Conn returns the connection, beginning first, within InTx's context, if
// need be: statements on it run in the transaction.
func (lt *lazyTx) Conn() *pgx.Conn {
	_, _ = lt.begun(lt.ctx) // a failure is InTx's to return
	return lt.conn
}

// Commit commits what began; fn need not call it (InTx commits).
func (lt *lazyTx) Commit(ctx context.Context) error {
	switch {
	case lt.closed:
		return pgx.ErrTxClosed
	case lt.err != nil:
		return lt.err
	}
	if lt.tx == nil {
		lt.closed = true
		return nil // nothing began: nothing to commit
	}
	err := lt.tx.Commit(ctx)
	lt.closed = true
	return err
}

// Rollback rolls back what began.
func (lt *lazyTx) Rollback(ctx context.Context) error {
	if lt.closed {
		return pgx.ErrTxClosed
	}
	if lt.tx == nil {
		lt.closed = true
		return nil
	}
	err := lt.tx.Rollback(ctx)
	lt.closed = true
	return err
}

// batchRow is the row of a statement that rode with BEGIN: Scan closes
// the batch, as a row's Scan closes its rows.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// failed returns batch results that report err, for the rows of a call
// whose begin failed.
func failed(err error) pgx.BatchResults {
	return pgx.FailedBatchResults(&pgx.Batch{}, err)
}

var _ pgx.Tx = (*lazyTx)(nil)
