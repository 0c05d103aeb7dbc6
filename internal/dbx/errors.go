package dbx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// stater is an error that carries a SQLSTATE: *pq.Error and
// *pgconn.PgError both are.
type stater interface{ SQLState() string }

// SQLState returns the SQLSTATE of the first error in err's chain that
// carries one (a *pgconn.PgError, a *pq.Error, ...), or "".
func SQLState(err error) string {
	if pg := PgError(err); pg != nil {
		return pg.Code
	}
	return ""
}

// PgError returns the first *pgconn.PgError in err's chain; failing that,
// one made from the first error that carries a SQLSTATE (Code from it,
// Message its text); or nil.
func PgError(err error) *pgconn.PgError {
	if err == nil {
		return nil
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg
	}
	var s stater
	if errors.As(err, &s) {
		return &pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: s.SQLState(), Message: s.(error).Error()}
	}
	return nil
}

// Error returns err so that errors.As finds a *pgconn.PgError in it when
// it carries a SQLSTATE (see PgError), with err itself still in the chain.
// nil and errors already holding a *pgconn.PgError are returned as they are.
func Error(err error) error {
	if err == nil {
		return nil
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return err
	}
	if pg = PgError(err); pg == nil {
		return err
	}
	return &stateError{err: err, pg: pg}
}

// stateError is a driver's error that errors.As also reads as a
// *pgconn.PgError.
type stateError struct {
	err error
	pg  *pgconn.PgError
}

func (e *stateError) Error() string { return e.err.Error() }
func (e *stateError) Unwrap() error { return e.err }

// As sets target to the *pgconn.PgError when it is a **pgconn.PgError.
func (e *stateError) As(target any) bool {
	if p, ok := target.(**pgconn.PgError); ok {
		*p = e.pg
		return true
	}
	return false
}
