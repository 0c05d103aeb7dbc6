package pglock

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// XactLock takes the exclusive transaction-scoped lock name on tx, waiting
// while another session holds it (in either scope: a session lock and a
// transaction lock on one name exclude each other). The lock is released
// when tx commits or rolls back; there is no unlock. ctx bounds the wait;
// if it ends, the statement fails and tx is aborted, so roll it back.
// A deadline of ctx travels with the statement as its lock_timeout, so
// that the server ends the wait by itself even if the cancel is lost; tx
// keeps its own lock_timeout.
// Bad input (invalid name, nil ctx or tx) returns an error matching
// ErrInvalid before anything is sent.
//
// Transaction locks work through PgBouncer in transaction mode, unlike Lock.
func XactLock(ctx context.Context, tx pgx.Tx, name string) error {
	if err := checkXact(ctx, tx, name, "xact lock"); err != nil {
		return err
	}
	tag, err := xactLock(ctx, tx, sqlXactLock, sqlXactLockUntil, Key(name))
	if err != nil {
		return opErr("xact lock", name, err)
	}
	if tag.RowsAffected() == 0 {
		return opErr("xact lock", name, ErrStandby)
	}
	return nil
}

// TryXactLock takes the exclusive transaction-scoped lock name on tx if no
// other session holds it, reporting whether it did. false with a nil error
// means another session holds it. The lock is released when tx ends.
func TryXactLock(ctx context.Context, tx pgx.Tx, name string) (bool, error) {
	if err := checkXact(ctx, tx, name, "try xact lock"); err != nil {
		return false, err
	}
	ok, err := tryXactLock(ctx, tx, Key(name))
	if err != nil {
		return false, opErr("try xact lock", name, err)
	}
	return ok, nil
}

// xactLock runs the blocking acquire plain, or until, when ctx has a
// deadline, with it as the statement's lock_timeout; arg is the key or
// keys. Its error is ctx's once ctx has ended (ctxFirst), and the
// caller's to wrap.
func xactLock(ctx context.Context, tx pgx.Tx, plain, until string, arg any) (pgconn.CommandTag, error) {
	var (
		tag pgconn.CommandTag
		err error
	)
	if timeout := lockTimeout(ctx); timeout == nil {
		tag, err = tx.Exec(ctx, plain, arg)
	} else {
		tag, err = tx.Exec(ctx, until, arg, *timeout)
		if pgerr.Code(err) == pgerr.LockNotAvailable {
			<-ctx.Done() // the server's deadline is ctx's, rounded up (see wait)
		}
	}
	if err != nil {
		return tag, ctxFirst(ctx, err)
	}
	return tag, nil
}

// tryXactLock tries key on tx; its error is the caller's to wrap.
func tryXactLock(ctx context.Context, tx pgx.Tx, key int64) (bool, error) {
	var ok bool
	err := tx.QueryRow(ctx, sqlTryXactLock, key).Scan(&ok)
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrStandby
	}
	return ok, err
}

func checkXact(ctx context.Context, tx pgx.Tx, name, op string) error {
	if err := checkCall(ctx, name); err != nil {
		return err
	}
	if dbx.IsNil(tx) {
		return invalid("transaction", "is nil")
	}
	if err := ctx.Err(); err != nil {
		return opErr(op, name, err)
	}
	return nil
}
