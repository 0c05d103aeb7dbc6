package pgerr

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestHint(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("query: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m"})
	}
	cases := []struct {
		err       error
		hint      string
		permanent bool
	}{
		{pg(InvalidSchemaName), HintNotMigrated, true},
		{pg(UndefinedTable), HintNotMigrated, true},
		{pg(UndefinedFunction), HintNotMigrated, true},
		{pg(InsufficientPrivilege), HintPrivileges, true},
		{pg(ReadOnlySQLTransaction), HintStandby, false},
		{pg(LockNotAvailable), HintLockTimeout, false},
		{pg(QueryCanceled), HintCanceled, false},
		{pg(AdminShutdown), HintTerminated, false},
		{pg(TransactionTimeout), HintTxTimeout, false},
		{pg(IdleInTxTimeout), HintIdleInTx, false},
		{pg("23505"), "", false},
		{pg("22P05"), "", true}, // untranslatable_character
		{pg("22023"), "", true}, // invalid_parameter_value
		{errors.New("no SQLSTATE"), "", false},
		{nil, "", false},
	}
	for _, c := range cases {
		if got := Hint(c.err); got != c.hint {
			t.Errorf("Hint(%v) = %q, want %q", c.err, got, c.hint)
		}
		if got := Permanent(c.err); got != c.permanent {
			t.Errorf("Permanent(%v) = %v, want %v", c.err, got, c.permanent)
		}
		wrapped := WithHint(c.err)
		if !errors.Is(wrapped, c.err) {
			t.Errorf("WithHint(%v) = %v does not wrap it", c.err, wrapped)
		}
		if c.hint != "" && wrapped.Error() != c.hint+": "+c.err.Error() {
			t.Errorf("WithHint(%v) = %q", c.err, wrapped)
		}
	}
}

// The server's ERROR is told by its unlocalized severity: lc_messages
// translates the other (a German server says FEHLER). A refused migration
// file leaves the version clean, and a pglock Unlock that failed is not a
// loss, only after it; FATAL ends the session, and an error of the
// client's (the connection lost) leaves the outcome unknown.
func TestStatementError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "55P03"}, true},
		{fmt.Errorf("run: %w", &pgconn.PgError{Severity: "FEHLER", SeverityUnlocalized: "ERROR", Code: "55P03"}), true},
		{&pgconn.PgError{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P01"}, false},
		{&pgconn.PgError{Severity: "ERROR", SeverityUnlocalized: "FATAL", Code: "25P04"}, false},
		{io.ErrUnexpectedEOF, false},
		{nil, false},
	} {
		if got := StatementError(c.err); got != c.want {
			t.Errorf("StatementError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
