package fencing

import (
	"fmt"
	"strings"
)

// SQLSTATEs raised by pgfence.fence_guard, the trigger Protect installs. They
// are in the PF class, which PostgreSQL leaves to applications. Clients in
// other languages, and plain SQL, can match on them directly.
const (
	// SQLStateStale: the write's token is stale — lower than the fence
	// stored in the row, or (for a token that names a lease) not that
	// lease's current, unexpired grant.
	SQLStateStale = "PF001"
	// SQLStateNoToken: the write declares no token (or a malformed one).
	SQLStateNoToken = "PF002"
)

// The package's SQL, in one place. Every value is a parameter; the only
// identifier (a table name) reaches the database as a parameter too, quoted
// by pgx.Identifier and cast to regclass on the server.
const (
	// sqlDeclareToken declares the token for the current transaction
	// (pgfence.declare binds it to the transaction's id: it is honoured by
	// no other transaction). A procedure (migration 12), run by CALL:
	// PostgreSQL neither plans it nor returns a row, as it does for SELECT
	// pgfence.declare_token. $1 = lease, $2 = fence.
	sqlDeclareToken = `CALL pgfence.declare($1, $2)`

	// sqlBeginDeclare opens a transaction and declares the token in one
	// round trip (simple protocol, two statements), where db can BeginTx
	// and the lease name is ASCII. It cannot take parameters, so the
	// values are spliced in a form that no setting can misread: the lease
	// as an escape string constant (quoteLease), the fence as a decimal
	// integer (%d).
	sqlBeginDeclare = `BEGIN; CALL pgfence.declare(%s, %d)`

	// sqlProtect installs the guard. $1 = quoted, possibly schema-qualified
	// table name; the regclass cast resolves it (search_path applies to an
	// unqualified name) and fails with undefined_table if there is none.
	sqlProtect = `SELECT pgfence.protect($1::regclass)`
)

// quoteLease writes a valid lease name (UTF-8, no NUL) as a PostgreSQL
// escape string constant, E'...', in ASCII only: printable ASCII as is,
// except ' (doubled) and \ (doubled); every other character as a Unicode
// escape (\uXXXX, \UXXXXXXXX). An escape string means the same whatever
// standard_conforming_strings says, an ASCII text the same in every client
// encoding, and PostgreSQL converts a Unicode escape into the database's
// encoding — except into SQL_ASCII above U+007F, which is why Begin quotes
// only ASCII names and declares others as a parameter. (Hex decoded on the
// server, as before, cost 7 % of a one-row fenced transaction's server
// instructions.)
func quoteLease(lease string) string {
	var b strings.Builder
	b.Grow(len(lease) + 3)
	b.WriteString("E'")
	for _, r := range lease {
		switch {
		case r == '\'' || r == '\\':
			b.WriteRune(r)
			b.WriteRune(r)
		case r >= 0x20 && r < 0x7f:
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			fmt.Fprintf(&b, "\\U%08x", r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}
