// Package pgerr turns PostgreSQL errors into advice: it maps SQLSTATEs to
// the hint an operator needs ("run `pgfence migrate up`"), in one place for
// pglock, leases, fencing and the pgfence command. Errors are read by
// SQLSTATE from *pgconn.PgError, never by message text.
package pgerr

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs pgfence reads.
const (
	InvalidSchemaName      = "3F000" // schema pgfence does not exist
	UndefinedTable         = "42P01" // pgfence.leases does not exist
	UndefinedFunction      = "42883" // pgfence.lock_key, try_acquire, ... do not exist
	InsufficientPrivilege  = "42501"
	ReadOnlySQLTransaction = "25006" // a standby, or default_transaction_read_only
	LockNotAvailable       = "55P03" // lock_timeout expired
	QueryCanceled          = "57014" // a cancel request or statement_timeout
	AdminShutdown          = "57P01" // pg_terminate_backend or a server shutdown
	TransactionTimeout     = "25P04" // transaction_timeout (PostgreSQL 17) ended the session
	IdleInTxTimeout        = "25P03" // idle_in_transaction_session_timeout ended the session
	SerializationFailure   = "40001" // repeatable read or serializable: a concurrent update or dependency
	DeadlockDetected       = "40P01"
	OutOfMemory            = "53200" // out of shared memory: PostgreSQL's lock table is full
)

// Hints, one per cause. They are advice, so they live here and in the
// docs, never in sentinel errors.
const (
	HintNotMigrated = "schema pgfence missing or out of date: run `pgfence migrate up`"
	HintPrivileges  = "the role lacks privileges on schema pgfence: GRANT pgfence_client (or pgfence_operator, for force-release, fence bump and check) TO it"
	HintStandby     = "read-only transaction: connected to a standby, or the role or database sets default_transaction_read_only = on; use the primary (e.g. a multi-host connection string with target_session_attrs=read-write) with a role that may write"
	HintLockTimeout = "the session's lock_timeout ended the wait"
	HintCanceled    = "the server cancelled the statement: the session's statement_timeout (pgfence's waits need statement_timeout = 0, or above the longest wait), or a cancel request"
	HintTerminated  = "the server ended the session (pg_terminate_backend or a shutdown)"
	HintTxTimeout   = "the session's transaction_timeout ended the session (pgfence's waits need transaction_timeout = 0, or above the longest wait)"
	HintIdleInTx    = "the session's idle_in_transaction_session_timeout ended the session: the transaction stayed idle between statements longer than it allows (a frozen or slow holder, or work done outside the database inside a transaction)"
)

// Code returns the SQLSTATE of the first *pgconn.PgError in err's chain,
// or "" if there is none.
func Code(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// Hint returns the advice for err's SQLSTATE, or "" when none is known.
func Hint(err error) string {
	switch Code(err) {
	case InvalidSchemaName, UndefinedTable, UndefinedFunction:
		return HintNotMigrated
	case InsufficientPrivilege:
		return HintPrivileges
	case ReadOnlySQLTransaction:
		return HintStandby
	case LockNotAvailable:
		return HintLockTimeout
	case QueryCanceled:
		return HintCanceled
	case AdminShutdown:
		return HintTerminated
	case TransactionTimeout:
		return HintTxTimeout
	case IdleInTxTimeout:
		return HintIdleInTx
	}
	return ""
}

// WithHint returns err prefixed with its hint ("<hint>: <err>", still
// wrapping err), or err itself when no hint is known. Wrap it once more
// with the operation: fmt.Errorf("leases: get %q: %w", name, WithHint(err)).
func WithHint(err error) error {
	if h := Hint(err); h != "" {
		return fmt.Errorf("%s: %w", h, err)
	}
	return err
}

// Permanent reports whether err will not go away by retrying the same
// call: the pgfence schema or a privilege on it is missing, or the input
// is a data exception (class 22: a name or data the database's encoding
// cannot hold, say), which the same input raises every time.
func Permanent(err error) bool {
	switch code := Code(err); code {
	case InvalidSchemaName, UndefinedTable, UndefinedFunction, InsufficientPrivilege:
		return true
	default:
		return strings.HasPrefix(code, dataException)
	}
}

// dataException is the class of SQLSTATEs of bad data (22xxx).
const dataException = "22"

// StatementError reports whether err is an error that a live session
// raised for a statement (severity ERROR): the statement, and its
// transaction, ended; the session did not. Any other error — FATAL, a
// broken connection, another driver's error — may mean that the session is
// gone. It reads the unlocalized severity: the other follows lc_messages
// (a German server says FEHLER).
func StatementError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.SeverityUnlocalized == "ERROR"
}
