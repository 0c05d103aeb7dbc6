package dbx

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// destroyTimeout bounds the polite close (Terminate message) of a
// destroyed connection; the socket is closed regardless.
const destroyTimeout = time.Second

// Destroy takes conn out of its pool and closes it, ending its session,
// for a connection whose state is in doubt. Its socket is closed too: a
// connection pgx already gave up on (a timed-out read, a cancelled
// statement) is closed by a goroutine of pgx's that first drains the
// socket, for up to 15s when the server is cut off; closing the socket
// ends it now.
func Destroy(conn *pgxpool.Conn) {
	c := conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), destroyTimeout)
	_ = c.Close(ctx)
	cancel()
	_ = c.PgConn().Conn().Close()
}

// Discard is Destroy over database/sql, which has no Hijack: ErrBadConn
// from Raw makes database/sql close sc's driver connection, and so its
// session, instead of returning it to the pool.
func Discard(sc *sql.Conn) {
	_ = sc.Raw(func(any) error { return driver.ErrBadConn })
	_ = sc.Close() // ErrConnDone: Raw has closed it
}
