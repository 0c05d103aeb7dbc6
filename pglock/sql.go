package pglock

// The statements pglock runs, in one place. Every one takes the lock key
// ($1, a bigint from Key) as its only parameter; names never reach SQL text.
const (
	// Session-scoped, on the Lock's pinned connection. The acquiring
	// statements return the answering backend's pid, so that a connection
	// whose server session is not the one it was opened on (a
	// transaction-mode pooler) can be checked (verifySession), and they
	// return no row on a standby (a server in recovery), where an advisory
	// lock would exclude nobody on the primary: the WHERE of a FROM-less
	// SELECT is a one-time filter evaluated before the lock function, which
	// then never runs.
	sqlLock          = `SELECT pg_backend_pid(), pg_advisory_lock($1) WHERE NOT pg_is_in_recovery()`
	sqlLockShared    = `SELECT pg_backend_pid(), pg_advisory_lock_shared($1) WHERE NOT pg_is_in_recovery()`
	sqlTryLock       = `SELECT pg_backend_pid(), pg_try_advisory_lock($1) WHERE NOT pg_is_in_recovery()`
	sqlTryLockShared = `SELECT pg_backend_pid(), pg_try_advisory_lock_shared($1) WHERE NOT pg_is_in_recovery()`
	sqlUnlock        = `SELECT pg_advisory_unlock($1)`
	sqlUnlockShared  = `SELECT pg_advisory_unlock_shared($1)`

	// Transaction-scoped, on the caller's transaction (no row on a standby,
	// as above).
	sqlXactLock    = `SELECT pg_advisory_xact_lock($1) WHERE NOT pg_is_in_recovery()`
	sqlTryXactLock = `SELECT pg_try_advisory_xact_lock($1) WHERE NOT pg_is_in_recovery()`
)

// sqlVerifySession reports the backend that answers and whether that
// backend holds the advisory lock $1:$2 (classid, objid: the key's high
// and low 32 bits) granted in mode $3, in this database, as a session lock
// (objsubid 1, the form pg_advisory_lock(bigint) takes) — and, if it does
// not, which backend of this database holds that lock in that mode (0 when
// none). Its parameters are bigint and text so that it runs the same in
// every pgx query exec mode.
const sqlVerifySession = `
WITH mine AS (
  SELECT pid
    FROM pg_locks
   WHERE locktype = 'advisory'
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1
     AND mode = $3 AND granted
)
SELECT pg_backend_pid(),
       EXISTS (SELECT 1 FROM mine WHERE pid = pg_backend_pid()),
       COALESCE((SELECT min(pid) FROM mine WHERE pid <> pg_backend_pid()), 0)`
