package migrations

import (
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A refused file leaves the version clean only after the server's ERROR,
// told by its unlocalized severity: lc_messages translates the other
// (a German server says FEHLER). FATAL ends the session, and an error of
// the client's (the connection lost) leaves the outcome unknown.
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
		if got := statementError(c.err); got != c.want {
			t.Errorf("statementError(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
