package pglock

import "github.com/jackc/pgx/v5/pgconn"

// A proven session is a pgx connection whose server session pglock has
// seen answer an acquiring statement as the backend the connection was
// opened to, on a primary: the statement returned a row (WHERE NOT
// pg_is_in_recovery()) and its pg_backend_pid() was the pid of the
// connection's BackendKeyData. Both facts last as long as the connection:
//
//   - A server session never goes from primary to standby: a primary
//     becomes a standby only by restarting, which ends every session.
//   - A direct connection (or one through a TCP proxy) talks to one server
//     session for life. A pooler that moves clients between server
//     sessions must answer their cancel requests itself, so it hands them
//     backend keys of its own, whose pid the first check does not match;
//     such a connection is never proven and every acquire checks again.
//
// So on a proven session the single-key acquires drop both checks
// (sqlTryLockProven and the like). The mark lives in the connection's
// CustomData, which pgx keeps with the connection and drops with it; pglock
// reads and writes it only while it has the connection acquired.

// provenKey is pglock's key in a connection's CustomData; its value is the
// backend pid that was proven.
const provenKey = "github.com/pgfence/pgfence/pglock.proven"

// proven returns the pid of c's session if it is proven, and 0 if not.
func proven(c *pgconn.PgConn) uint32 {
	if pid, _ := c.CustomData()[provenKey].(uint32); pid == c.PID() {
		return pid
	}
	return 0
}

// prove marks c's session proven: the caller has just seen an acquiring
// statement on c return a row, with pid c.PID().
func prove(c *pgconn.PgConn) {
	if m := c.CustomData(); m != nil {
		m[provenKey] = c.PID()
	}
}
