package fencing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/names"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/spans"
)

// tracerName is the instrumentation scope of InTx's spans.
const tracerName = "github.com/pgfence/pgfence/fencing"

// tracer starts InTx's spans on the global TracerProvider, unless
// WithTracerProvider says otherwise.
var tracer = spans.New(nil, tracerName)

// spanFencedTx is the name of InTx's span.
const spanFencedTx = "pgfence.fenced_tx"

// DB is what the package needs from a database handle: a way to begin a
// transaction and to run a statement. *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn
// and pgx.Tx all satisfy it.
//
// With a pgx.Tx, Begin opens a savepoint ("nested transaction") and the
// token it declares stays declared until the outer transaction ends, even
// after the savepoint is released: PostgreSQL keeps a transaction-local
// setting made in a released savepoint until the top-level transaction ends.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// rollbackTimeout bounds the ROLLBACK sent after a failure, which runs even
// when the caller's context is already done.
const rollbackTimeout = 5 * time.Second

// Begin opens a transaction on db that declares tok: every write it makes to
// a protected table is checked by the guard, and stamped with tok.Fence.
// The caller must end the transaction with Commit or Rollback (Rollback is
// safe to call after Commit, as with any pgx.Tx).
//
// The declaration (CALL pgfence.declare, migration 12) is bound to this
// transaction: it vanishes at COMMIT or ROLLBACK and is honoured by no
// other transaction, so a pooled connection never carries it to someone
// else. A database without migration 12 fails Begin with a message saying
// to run `pgfence migrate up`. Where db can BeginTx (*pgxpool.Pool,
// *pgxpool.Conn, *pgx.Conn) and the lease name is ASCII, BEGIN and the
// declaration share one round trip; on a pgx.Tx, Begin opens a savepoint
// and declares in a second one, and the token stays declared until the
// outer transaction ends. A name with other characters is declared in a
// second round trip too, as a parameter: it reaches the server as the
// grant's name did, in any database encoding (SQL_ASCII included). In a
// database whose encoding is not UTF-8, connect with client_encoding=UTF8:
// otherwise pgx sends Go's UTF-8 as the database's encoding, and a
// non-ASCII lease name is stored, and declared, as another name than the
// one the application chose, which clients configured otherwise and the
// pgfence command do not see.
//
// Begin validates tok first (ErrInvalid) and sends nothing if it is
// invalid; it does not check staleness — the guard does, on each write, so
// a rejected statement returns the guard's *pgconn.PgError: test it with
// IsStale, or use InTx, which maps it to ErrStale. ctx bounds BEGIN and the
// declaration; after that, ctx is whatever the caller passes to the
// transaction's methods. If declaring fails, the transaction is rolled back
// and Begin returns the error: one matching ErrNoToken if the server
// refused the token (a name Validate accepts can be longer than 200 bytes
// in the database's encoding).
func Begin(ctx context.Context, db DB, tok Token) (pgx.Tx, error) {
	if err := checkBegin(ctx, db, tok); err != nil {
		return nil, err
	}
	// In the BEGIN, only an ASCII name: quoteLease spells others with
	// escapes above U+007F, which PostgreSQL cannot convert to SQL_ASCII.
	if b, ok := db.(txBeginner); ok && names.ASCII(tok.Lease) {
		tx, err := b.BeginTx(ctx, pgx.TxOptions{BeginQuery: fmt.Sprintf(sqlBeginDeclare, quoteLease(tok.Lease), tok.Fence)})
		if err != nil {
			if conn := connOf(db); conn != nil && conn.PgConn().TxStatus() != 'I' {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
				_, _ = conn.Exec(rctx, "ROLLBACK") // the declaration's failure matters more
				cancel()
			} // a pool discards a connection left inside a transaction
			return nil, fmt.Errorf("fencing: begin with token %v%s: %w", tok, notMigrated(err), classify(tok, err))
		}
		return tx, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("fencing: begin: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlDeclareToken, tok.Lease, tok.Fence); err != nil {
		rollback(ctx, tx)
		return nil, fmt.Errorf("fencing: declare token %v%s: %w", tok, notMigrated(err), classify(tok, err))
	}
	return tx, nil
}

// notMigrated is what to add to a failed declaration's context when the
// database lacks pgfence.declare (migration 12) or schema pgfence.
func notMigrated(err error) string {
	switch sqlState(err) {
	case pgerr.UndefinedFunction, pgerr.InvalidSchemaName:
		return " (pgfence.declare is missing: run `pgfence migrate up`; fencing needs migration 12)"
	}
	return ""
}

// checkBegin validates the arguments of Begin and BeginDB.
func checkBegin(ctx context.Context, db any, tok Token) error {
	if dbx.IsNil(db) {
		return fmt.Errorf("%w: db must not be nil", ErrInvalid)
	}
	if ctx == nil {
		return fmt.Errorf("%w: context must not be nil", ErrInvalid)
	}
	return tok.Validate()
}

// txBeginner is a DB that can open a transaction with a custom BEGIN.
type txBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// connOf returns the connection under db if db exposes one — a *pgx.Conn,
// a *pgxpool.Conn, any handle with a Conn() *pgx.Conn method — or nil (a
// *pgxpool.Pool, whose BeginTx releases the connection it acquired).
func connOf(db DB) *pgx.Conn {
	switch c := db.(type) {
	case *pgx.Conn:
		return c
	case interface{ Conn() *pgx.Conn }:
		return c.Conn()
	}
	return nil
}

// InTx runs fn in a transaction on db that declares tok (see Begin), and
// commits if fn returns nil. If fn returns an error or panics, the
// transaction is rolled back (and the panic continues).
//
// Over a *pgxpool.Pool, *pgxpool.Conn or *pgx.Conn, InTx sends nothing
// before fn's first call: fn's first Exec or QueryRow with arguments goes
// to the server in one round trip with BEGIN and the declaration, so a
// fenced write of one statement takes two round trips, as the statement
// and COMMIT alone do; any other first call begins as Begin does, then
// runs. A pgx tracer on the connection is told of that first round trip
// as a batch (pgx.BatchTracer: BEGIN, the declaration and the statement),
// not as a query (pgx.QueryTracer). fn's tx is then InTx's own pgx.Tx.
// If the server refuses the declaration, fn's first call returns the
// error Begin would have, no statement of fn runs, and InTx returns that
// error whatever fn returns; an fn that makes no call sends nothing. On a
// pgx.Tx, or any other DB, InTx begins with Begin before calling fn.
//
// A write the guard rejects as stale makes InTx return an error that
// satisfies errors.Is(err, ErrStale) — a *StaleError wrapping the error fn
// or COMMIT returned — whether fn returned the statement's error as is or
// wrapped. A write that declares no token maps to ErrNoToken. Any other
// error from fn is returned unchanged; errors from BEGIN and COMMIT are
// wrapped with context. Once InTx returns ErrStale, the holder is stale:
// retrying with the same token cannot succeed.
//
// ctx bounds the whole transaction: fn should pass it to the statements it
// runs on tx. Cancelling ctx aborts the transaction — but once COMMIT is
// sent, as with any transaction, it may have committed although InTx
// returns ctx's error. A caller that must know whether its write landed
// (a worker stopped by a signal) should let the transaction finish, on a
// context of its own with a timeout. InTx is safe to call concurrently;
// each call has its own transaction.
//
// opts configure telemetry (WithMeterProvider, WithTracerProvider; later
// ones win). InTx runs in a span "pgfence.fenced_tx" (attributes
// pgfence.lease.name and pgfence.lease.fence), and each rejection it
// returns (ErrStale or ErrNoToken) adds one to the counter
// pgfence.fenced_writes.rejected (see the package documentation's
// Telemetry section). Without options both use the global providers, and
// until the application installs a tracer provider InTx starts no span.
func InTx(ctx context.Context, db DB, tok Token, fn func(tx pgx.Tx) error, opts ...Option) error {
	if lazyBeginner(db) && fn != nil {
		return inTx(ctx, tok, func(lt *lazyTx) error {
			if err := fn(lt); lt.err == nil {
				return err
			}
			return lt.err // a failed begin or a lost connection, whatever fn made of it
		}, opts,
			func(ctx context.Context) (*lazyTx, error) {
				if err := checkBegin(ctx, db, tok); err != nil {
					return nil, err
				}
				return newLazyTx(ctx, db, tok)
			},
			func(ctx context.Context, lt *lazyTx) error {
				defer lt.done()
				return lt.Commit(ctx)
			},
			func(ctx context.Context, lt *lazyTx) {
				defer lt.done()
				rollback(ctx, lt)
			})
	}
	return inTx(ctx, tok, fn, opts,
		func(ctx context.Context) (pgx.Tx, error) { return Begin(ctx, db, tok) },
		func(ctx context.Context, tx pgx.Tx) error { return tx.Commit(ctx) },
		rollback)
}

// inTx is InTx and InDBTx over a transaction of type T: it checks fn and
// ctx, then runs runTx in the span, which ends with runTx's error, or
// with errNotReturned if runTx panicked.
func inTx[T any](ctx context.Context, tok Token, fn func(tx T) error, opts []Option,
	begin func(ctx context.Context) (T, error), commit func(ctx context.Context, tx T) error,
	abort func(ctx context.Context, tx T)) (err error) {
	if fn == nil {
		return fmt.Errorf("%w: fn must not be nil", ErrInvalid)
	}
	tr, rejected, err := telemetryOf(opts)
	if err != nil {
		return err
	}
	if ctx == nil { // before the span, which would start from it
		return fmt.Errorf("%w: context must not be nil", ErrInvalid)
	}
	ctx, span := tr.Start(ctx, spanFencedTx, tok.Lease, tok.Fence)
	returned := false
	defer func() {
		if !returned { // fn (or the driver) panicked: rolled back, the panic goes on
			span.End(0, errNotReturned)
			return
		}
		span.End(0, err)
	}()
	err = runTx(ctx, tok, fn, rejected, begin, commit, abort)
	returned = true
	return err
}

// errNotReturned is the error of the span of an InTx or InDBTx that did
// not return: fn panicked (or called runtime.Goexit), and the transaction
// was rolled back. It is not recovered, so the panic value is not known
// here; recovering to read it would lose the panic's stack.
var errNotReturned = errors.New("fencing: fn panicked; the transaction was rolled back")

// runTx is inTx inside its span: it begins with begin, runs fn and
// commits, rolling back (abort) on any failure or panic, and classifies
// and counts what is rejected.
func runTx[T any](ctx context.Context, tok Token, fn func(tx T) error, rejected *rejectedCounter,
	begin func(ctx context.Context) (T, error), commit func(ctx context.Context, tx T) error,
	abort func(ctx context.Context, tx T)) error {
	tx, err := begin(ctx)
	if err != nil {
		rejected.record(ctx, err) // a declaration the server refused
		return err
	}
	committed := false
	defer func() {
		if !committed {
			abort(ctx, tx)
		}
	}()
	if err := fn(tx); err != nil {
		err = classify(tok, err)
		rejected.record(ctx, err)
		return err
	}
	err = commit(ctx, tx)
	committed = true // a COMMIT that failed needs no rollback; one that panicked does
	if err != nil {
		err = classify(tok, fmt.Errorf("fencing: commit: %w", err))
		rejected.record(ctx, err)
		return err
	}
	return nil
}

// telemetryOf reads InTx's options: the tracer and the rejection counter
// (nil: the global provider's), or the first invalid option's error.
func telemetryOf(opts []Option) (*spans.Tracer, *rejectedCounter, error) {
	tr, rejected := tracer, (*rejectedCounter)(nil)
	for _, o := range opts {
		switch {
		case o.err != nil:
			return nil, nil, o.err
		case o.rejected != nil:
			rejected = o.rejected
		case o.tracer != nil:
			tr = o.tracer
		}
	}
	return tr, rejected, nil
}

// rollback ends tx after a failure, even if ctx is done.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(ctx) // the failure being reported matters more
}
