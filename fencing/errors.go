package fencing

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/dbx"
)

// ErrStale means the database rejected a write because its token is stale:
// a newer holder exists (or existed), so this holder must stop. Match it with
// errors.Is, or with IsStale, which also recognises the raw PostgreSQL error
// of plain SQL. Retrying with the same token cannot succeed.
var ErrStale = errors.New("fencing: stale token: the database rejected the write")

// ErrNoToken means the database rejected a write to a protected table
// because the transaction declared no token (or a malformed one): the write
// did not go through Begin or InTx (or CALL pgfence.declare in the same
// transaction). It is a programming error, not a lost lease, so IsStale is
// false for it.
var ErrNoToken = errors.New("fencing: write to a protected table declares no token")

// StaleError is what InTx returns when the guard rejected a write as stale
// (SQLSTATE PF001). It satisfies errors.Is(err, ErrStale), and unwraps to the
// error as it was returned — by fn or by COMMIT — so errors.As still finds
// the *pgconn.PgError and any error of the caller's own. (Statements run on
// a transaction from Begin return pgx's errors unchanged: match those with
// IsStale.)
type StaleError struct {
	// Token is the token the rejected write declared: with InTx nested in
	// another InTx's fn, the inner one's.
	Token Token
	// PgError is the guard's rejection. Its Message says which rule
	// rejected the write; SchemaName and TableName name the table. Through
	// database/sql with a driver other than pgx's (lib/pq), it is made
	// from the driver's error: Code and Message only; the driver's error
	// is in the chain (errors.As).
	PgError *pgconn.PgError

	err error
}

// Error describes the rejection, naming the token.
func (e *StaleError) Error() string {
	return fmt.Sprintf("fencing: stale token %v: %v", e.Token, e.err)
}

// Unwrap returns the error as it was returned, which wraps PgError.
func (e *StaleError) Unwrap() error { return e.err }

// Is reports whether target is ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// IsStale reports whether err says the guard rejected a write as stale: an
// error matching ErrStale, or any error chain holding a *pgconn.PgError (or
// a database/sql driver's error with a SQLState method, such as lib/pq's
// *pq.Error) with SQLSTATE PF001 (what plain SQL through the guard
// returns). It is false for
// ErrNoToken and for every other failure.
func IsStale(err error) bool {
	return errors.Is(err, ErrStale) || sqlState(err) == SQLStateStale
}

// IsNoToken reports whether err says the guard rejected a write that declared
// no token: an error matching ErrNoToken, or any error chain holding a
// *pgconn.PgError (or a driver's error, as for IsStale) with SQLSTATE
// PF002.
func IsNoToken(err error) bool {
	return errors.Is(err, ErrNoToken) || sqlState(err) == SQLStateNoToken
}

// sqlState returns the SQLSTATE of the first error in err's chain that
// carries one (*pgconn.PgError, or a database/sql driver's error such as
// lib/pq's *pq.Error), or "".
func sqlState(err error) string { return dbx.SQLState(err) }

// classify maps the guard's rejections in err to the package's errors:
// PF001 to a *StaleError, PF002 to an error wrapping ErrNoToken. Any other
// error (and nil) is returned unchanged, and so is one classified already
// — a nested InTx's, whose *StaleError names the token that was stale.
func classify(tok Token, err error) error {
	var stale *StaleError
	if errors.As(err, &stale) || errors.Is(err, ErrNoToken) {
		return err
	}
	pgErr := dbx.PgError(err)
	if pgErr == nil {
		return err
	}
	switch pgErr.Code {
	case SQLStateStale:
		return &StaleError{Token: tok, PgError: pgErr, err: err}
	case SQLStateNoToken:
		return fmt.Errorf("%w: %w", ErrNoToken, err)
	}
	return err
}
