package leases

import (
	"database/sql"

	"github.com/pgfence/pgfence/internal/dbx"
)

// NewDB returns a Client over a database/sql handle, for applications that
// reach PostgreSQL through database/sql (pgx's stdlib driver, lib/pq; GORM
// and sqlx expose theirs). Grants, renewals, releases, Get, List,
// ForceRelease, RequestHandover, Observe, Run, Lead, semaphores and Once
// behave as over a pgx pool (New), with these differences:
//
//   - No notifications: database/sql cannot LISTEN, so waiters (Acquire,
//     Run, Lead, Observe) learn of a release by polling the lease table
//     (WithPollInterval, jittered), as New's client does behind a
//     transaction-mode pooler. A release by this Client still wakes its
//     own waiters at once, and releases still notify pgx clients of the
//     same database. WithNotifications(true) is invalid here.
//   - OnceTx needs pgx (its fn takes a pgx.Tx): use Once, or run the work
//     in fencing.InDBTx with the lease's Token.
//   - A grant whose caller gives up is settled as over pgx when the driver
//     is pgx's stdlib. Another driver sends no cancel request the client
//     can wait for: the grant's statement is waited for up to 250ms, then
//     its context is cancelled (lib/pq then sends a cancel request of its
//     own) and the call reports the grant in doubt.
//   - No statement is sent twice: each runs on a connection of its own
//     (sql.DB.Conn), never on db itself, which sends a statement again
//     when the driver answers driver.ErrBadConn. lib/pq answers it for any
//     connection that broke, also after the statement was sent, and a
//     grant sent twice would find the lease held by its own first copy, a
//     release the grant it ended gone (a false ErrLost). A statement on a
//     connection that broke fails instead, and a grant that may have
//     committed is ended.
//   - Every statement returns when its context ends, even where the driver
//     would go on reading (lib/pq on a silent network, or starting a new
//     connection): the statement is left to end in the background, and
//     its connection goes back to db, or is discarded, when it does.
//
// Arrays travel as PostgreSQL array literals, which every driver binds,
// and PostgreSQL errors are read by SQLSTATE from any driver's error (a
// *pgconn.PgError, a *pq.Error), so the errors and hints are New's.
//
// It fails on a nil db or an invalid option; it does not touch the
// database. Close does not close db.
func NewDB(db *sql.DB, opts ...Option) (*Client, error) {
	if db == nil {
		return nil, invalid("leases: db must not be nil")
	}
	c, err := configure(opts, true)
	if err != nil {
		return nil, err
	}
	c.sdb = db
	c.setQuerier(dbx.SQL(db))
	c.start()
	return c, nil
}
