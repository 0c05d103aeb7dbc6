package pglock

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrPooler means a session lock was granted to a different server session
// than the one the connection now talks to: a transaction-mode pooler sits
// between the client and PostgreSQL. Lock, TryLock, RLock and TryRLock
// return it (wrapped) when they detect that; no Lock is returned and the
// connection is destroyed.
//
// The lock itself stays held by the server session that was granted it,
// which the client can no longer reach: PgBouncer does not reset server
// sessions between transactions in transaction mode (server_reset_query
// runs only when server_reset_query_always is set), so it is released when
// PgBouncer closes that server connection (server_lifetime,
// server_idle_timeout, a RECONNECT or restart) or when an operator
// terminates the backend (the error names its pid when pg_locks shows it).
// Use XactLock or TryXactLock, or a lease, behind such a pooler; or give
// pglock a direct or session-pooled connection.
var ErrPooler = errors.New("pglock: transaction-mode pooler")

// verifySession checks, right after PostgreSQL granted the session
// advisory lock key (shared or exclusive) on conn, that the server session
// conn now talks to is the one holding it. It returns nil if so, and an
// error wrapping ErrPooler if not: the statement that took the lock ran on
// another server session, which only a transaction-mode pooler does.
//
// The check costs one round trip. It is conclusive when it fails, not when
// it passes: a transaction pooler may route the check to the very server
// session that took the lock (a lone client on an idle PgBouncer is handed
// the same one again), and the lock then seems to work until another
// client is handed that session in between. Under concurrency, which is
// when it matters, the check fires.
//
// ctx bounds the round trip. On any error but ErrPooler the lock state of
// conn is unknown as well; either way the caller must destroy conn.
func verifySession(ctx context.Context, conn *pgx.Conn, key int64, shared bool) error {
	mode := "ExclusiveLock"
	if shared {
		mode = "ShareLock"
	}
	classID, objID := int64(uint64(key)>>32), int64(uint32(key))
	var (
		pid    int32
		held   bool
		holder int32
	)
	if err := conn.QueryRow(ctx, sqlVerifySession, classID, objID, mode).Scan(&pid, &held, &holder); err != nil {
		return fmt.Errorf("verify session: %w", err)
	}
	if held {
		return nil
	}
	where := "no server session holds it"
	if holder != 0 {
		where = fmt.Sprintf("backend pid %d holds it", holder)
	}
	return fmt.Errorf("%w: lock %d was granted, but server session pid %d answering now does not hold it (%s; client-side backend key pid %d)",
		ErrPooler, key, pid, where, conn.PgConn().PID())
}
