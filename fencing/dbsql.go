package fencing

import (
	"context"
	"database/sql"
	"fmt"
)

// SQLBeginner is what BeginDB and InDBTx need from a database/sql handle:
// *sql.DB, *sql.Conn and sqlx's *sqlx.DB satisfy it, over any PostgreSQL
// driver (pgx's stdlib, lib/pq).
type SQLBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// BeginDB is Begin for database/sql: it opens a transaction on db with
// opts (nil: the defaults) and declares tok in it, in a second round trip
// (CALL pgfence.declare($1, $2)). The caller must end the
// transaction with Commit or Rollback. ctx is the transaction's context,
// as for db.BeginTx: database/sql rolls the transaction back if ctx ends
// before Commit.
//
// BeginDB validates tok first (ErrInvalid) and sends nothing if it is
// invalid. A write the guard rejects returns the driver's error: test it
// with IsStale and IsNoToken, which read the SQLSTATE of *pgconn.PgError
// and of lib/pq's *pq.Error alike, or use InDBTx, which maps it to
// ErrStale. If declaring fails, the transaction is rolled back and BeginDB
// returns the error.
func BeginDB(ctx context.Context, db SQLBeginner, tok Token, opts *sql.TxOptions) (*sql.Tx, error) {
	if err := checkBegin(ctx, db, tok); err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("fencing: begin: %w", err)
	}
	if _, err := tx.ExecContext(ctx, sqlDeclareToken, tok.Lease, tok.Fence); err != nil {
		_ = tx.Rollback() // the declaration's failure matters more
		return nil, fmt.Errorf("fencing: declare token %v%s: %w", tok, notMigrated(err), classify(tok, err))
	}
	return tx, nil
}

// InDBTx is InTx for database/sql: it runs fn in a transaction on db that
// declares tok (see BeginDB), and commits if fn returns nil; if fn returns
// an error or panics, the transaction is rolled back (and the panic
// continues). Rejections map as in InTx: a stale write makes InDBTx
// return a *StaleError (errors.Is(err, ErrStale)) wrapping the error fn or
// COMMIT returned, a write that declares no token an error matching
// ErrNoToken, whichever driver reported it. Other errors from fn are
// returned unchanged. ctx bounds the whole transaction; fn should pass it
// to the statements it runs on tx. opts are InTx's: the span
// pgfence.fenced_tx and the rejection counter are the same.
func InDBTx(ctx context.Context, db SQLBeginner, tok Token, fn func(tx *sql.Tx) error, opts ...Option) error {
	return inTx(ctx, tok, fn, opts,
		func(ctx context.Context) (*sql.Tx, error) { return BeginDB(ctx, db, tok, nil) },
		func(_ context.Context, tx *sql.Tx) error { return tx.Commit() },
		func(_ context.Context, tx *sql.Tx) { _ = tx.Rollback() }) // the failure being reported matters more
}
