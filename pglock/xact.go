package pglock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// XactLock takes the exclusive transaction-scoped lock name on tx, waiting
// while another session holds it (in either scope: a session lock and a
// transaction lock on one name exclude each other). The lock is released
// when tx commits or rolls back; there is no unlock. ctx bounds the wait; if
// it ends, the statement fails and tx is aborted, so roll it back.
//
// Transaction locks work through PgBouncer in transaction mode, unlike Lock.
func XactLock(ctx context.Context, tx pgx.Tx, name string) error {
	if err := checkXact(ctx, tx, name, "xact lock"); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, sqlXactLock, Key(name))
	if err != nil {
		return fmt.Errorf("pglock: xact lock %q: %w", name, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pglock: xact lock %q: %w", name, ErrStandby)
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
	var ok bool
	if err := tx.QueryRow(ctx, sqlTryXactLock, Key(name)).Scan(&ok); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			err = ErrStandby
		}
		return false, fmt.Errorf("pglock: try xact lock %q: %w", name, err)
	}
	return ok, nil
}

func checkXact(ctx context.Context, tx pgx.Tx, name, op string) error {
	if err := validateName(name); err != nil {
		return fmt.Errorf("pglock: %s: %w", op, err)
	}
	if tx == nil {
		return fmt.Errorf("pglock: %s %q: %w", op, name, errors.New("transaction is nil"))
	}
	if ctx == nil {
		return fmt.Errorf("pglock: %s %q: context is nil", op, name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pglock: %s %q: %w", op, name, err)
	}
	return nil
}
