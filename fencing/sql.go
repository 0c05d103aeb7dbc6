package fencing

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
	// sqlDeclareToken declares the token for the current transaction only
	// (is_local = true): it vanishes at COMMIT or ROLLBACK, so a pooled
	// connection never carries it into someone else's transaction. An
	// empty lease clears any session-level pgfence.lease.
	// $1 = fence (decimal text), $2 = lease name or ''.
	sqlDeclareToken = `SELECT set_config('pgfence.fence', $1, true), set_config('pgfence.lease', $2, true)`

	// sqlProtect installs the guard. $1 = quoted, possibly schema-qualified
	// table name; the regclass cast resolves it (search_path applies to an
	// unqualified name) and fails with undefined_table if there is none.
	sqlProtect = `SELECT pgfence.protect($1::regclass)`
)
