package pglock

// The statements pglock runs, in one place. Keys ($1) are bigints from
// Key; names never reach SQL text.
//
// The acquiring statements return the answering backend's pid, so that a
// connection whose server session is not the one it was opened on (a
// transaction-mode pooler) can be checked (verifySession), and they return
// no row on a standby (a server in recovery), where an advisory lock would
// exclude nobody on the primary: the WHERE of such a SELECT is a one-time
// filter evaluated before the lock function, which then never runs. A
// session that has passed both checks once runs the statements of one key
// without them (proven.go).

// withLockTimeout begins every blocking acquire: see sqlLock.
const withLockTimeout = `
WITH timeout AS (SELECT set_config('lock_timeout', coalesce($2, current_setting('lock_timeout')), true))`

const (
	// The blocking acquires set the statement's own lock_timeout first
	// ($2: ctx's remaining time, "1234ms"; NULL keeps the session's), so
	// that the server ends a wait bounded by a deadline by itself, even if
	// the client is gone. set_config(..., true) lasts until the end of the
	// statement's implicit transaction. A CTE with a volatile function is
	// evaluated once, before the outer SELECT's target list.
	sqlLock = withLockTimeout + `
SELECT pg_backend_pid(), pg_advisory_lock($1) FROM timeout WHERE NOT pg_is_in_recovery()`
	sqlLockShared = withLockTimeout + `
SELECT pg_backend_pid(), pg_advisory_lock_shared($1) FROM timeout WHERE NOT pg_is_in_recovery()`

	sqlUnlock       = `SELECT pg_advisory_unlock($1)`
	sqlUnlockShared = `SELECT pg_advisory_unlock_shared($1)`

	// sqlLockAll is sqlLock for the keys $1, taken one after the other in
	// array order (unnest returns it; the aggregate consumes the rows as
	// they come). Each wait is bounded by the lock_timeout $2; the count is
	// the number of keys taken, all of them unless the statement fails. No
	// row on a standby (HAVING: an aggregate otherwise returns one).
	sqlLockAll = withLockTimeout + `
SELECT pg_backend_pid(), count(pg_advisory_lock(k))
  FROM timeout, unnest($1::int8[]) AS k
 WHERE NOT pg_is_in_recovery()
HAVING count(*) > 0`

	// sqlUnlockAll releases the session locks $1 and reports whether
	// every one of them was held (bool_and evaluates every row).
	sqlUnlockAll = `SELECT coalesce(bool_and(pg_advisory_unlock(k)), false) FROM unnest($1::int8[]) AS k`

	// sqlTryLockAll tries the keys $1 in array order, in transaction scope
	// if $2 and in session scope otherwise, and stops at the first that is
	// held elsewhere: a recursive CTE runs one step at a time, each step on
	// the row the previous one produced. It returns the backend's pid, how
	// many keys it took (all of them, or the index of the refused one), and
	// in session scope whether the keys taken before a refused one were
	// given back — by the same statement, so on the same server session
	// even behind a transaction-mode pooler (NULL when there was nothing to
	// give back; in transaction scope the caller rolls back to a
	// savepoint). No row on a standby.
	sqlTryLockAll = `
WITH RECURSIVE taken(n, ok) AS (
  SELECT 0, true WHERE NOT pg_is_in_recovery()
  UNION ALL
  SELECT n + 1, CASE WHEN $2::boolean THEN pg_try_advisory_xact_lock(($1::int8[])[n + 1])
                     ELSE pg_try_advisory_lock(($1::int8[])[n + 1]) END
    FROM taken
   WHERE ok AND n < cardinality($1::int8[])
), got(n) AS (
  SELECT max(n) FILTER (WHERE ok) FROM taken HAVING count(*) > 0
)
SELECT pg_backend_pid(), n,
       (SELECT bool_and(pg_advisory_unlock(($1::int8[])[i])) FROM generate_series(1, n) AS i
         WHERE NOT $2::boolean AND n < cardinality($1::int8[]))
  FROM got`

	// Transaction-scoped, on the caller's transaction (no row on a standby,
	// as above).
	sqlXactLock    = `SELECT pg_advisory_xact_lock($1) WHERE NOT pg_is_in_recovery()`
	sqlTryXactLock = `SELECT pg_try_advisory_xact_lock($1) WHERE NOT pg_is_in_recovery()`

	// sqlXactLockAll takes the keys $1 in array order, as sqlLockAll.
	sqlXactLockAll = `
SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::int8[]) AS k
 WHERE NOT pg_is_in_recovery()
HAVING count(*) > 0`

	// sqlXactLockUntil and sqlXactLockAllUntil are sqlXactLock and
	// sqlXactLockAll whose waits the server ends by itself after the
	// lock_timeout $2 ("1234ms"): ctx's deadline, kept when the client's
	// cancel request is lost. The caller's transaction keeps its own
	// setting: it is set back in the same statement once the locks are
	// taken (l comes before the outer row), and a statement that fails
	// leaves the transaction, or the savepoint, to be rolled back, which
	// undoes the change. No row on a standby.
	sqlXactLockUntil = xactTimeout + `,
     l AS (SELECT pg_advisory_xact_lock($1) FROM t)
SELECT set_config('lock_timeout', t.prev, true) FROM t, l`
	sqlXactLockAllUntil = xactTimeout + `,
     l AS (SELECT count(pg_advisory_xact_lock(k)) FROM t, unnest($1::int8[]) AS k)
SELECT set_config('lock_timeout', t.prev, true) FROM t, l`
)

// xactTimeout sets the lock_timeout $2 for the rest of the transaction,
// and keeps the setting it replaces as prev (see sqlXactLockUntil).
const xactTimeout = `
WITH t AS (SELECT current_setting('lock_timeout') AS prev, set_config('lock_timeout', $2, true)
            WHERE NOT pg_is_in_recovery())`

// sqlLockRows are the advisory locks of the current database, one row per
// session holding or awaiting one, with that session from
// pg_stat_activity. Keys taken with the single-bigint form (objsubid = 1)
// are reassembled from classid (high 32 bits) and objid (low 32 bits); the
// two-int4 form (objsubid = 2) is not pglock's and is left out. A prepared
// transaction's lock has no pid (0 here): its GID comes from
// pg_prepared_xacts, through the transaction id lock of the same virtual
// transaction.
// pg_locks.waitstart exists from PostgreSQL 14 on; read through to_jsonb,
// it is NULL before.
const sqlLockRows = `
SELECT (l.classid::bigint << 32) | l.objid::bigint               AS key,
       l.mode = 'ShareLock'                                       AS shared,
       l.granted,
       coalesce(l.pid, 0)                                         AS pid,
       coalesce(a.application_name, '')                           AS application_name,
       coalesce(host(a.client_addr), '')                          AS client_addr,
       coalesce(a.state, '')                                      AS state,
       a.backend_start,
       a.state_change,
       CASE WHEN NOT l.granted THEN (to_jsonb(l) ->> 'waitstart')::timestamptz END AS wait_start,
       clock_timestamp()                                          AS read_at,
       coalesce(p.gid, '')                                        AS gid,
       p.prepared
  FROM pg_locks AS l
  LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
  LEFT JOIN LATERAL (SELECT t.gid, t.prepared
                       FROM pg_locks AS x JOIN pg_prepared_xacts AS t ON t.transaction = x.transactionid
                      WHERE l.pid IS NULL AND x.pid IS NULL AND x.locktype = 'transactionid'
                        AND x.virtualtransaction = l.virtualtransaction) AS p ON true
 WHERE l.locktype = 'advisory'
   AND l.objsubid = 1
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// sqlList lists sqlLockRows, all ($1 NULL) or those of key $1: per key,
// holders first, then waiters by wait start.
const sqlList = `
SELECT key, shared, granted, pid, application_name, client_addr, state,
       backend_start, state_change, wait_start, read_at, gid, prepared
  FROM (` + sqlLockRows + `) AS r
 WHERE $1::bigint IS NULL OR key = $1
 ORDER BY key, granted DESC, wait_start NULLS LAST, pid`

// The try statements take the lock if they can (no row on a standby).
const (
	sqlTryLock       = `SELECT pg_backend_pid(), pg_try_advisory_lock($1) WHERE NOT pg_is_in_recovery()`
	sqlTryLockShared = `SELECT pg_backend_pid(), pg_try_advisory_lock_shared($1) WHERE NOT pg_is_in_recovery()`
)

// The acquiring statements of one key on a proven session (proven.go):
// without the pid and the standby check, which such a session has passed
// once and for all. They cost the server 9 % less per lock cycle than the
// statements above (docs/performance.md).
const (
	sqlTryLockProven       = `SELECT pg_try_advisory_lock($1)`
	sqlTryLockSharedProven = `SELECT pg_try_advisory_lock_shared($1)`
	sqlLockProven          = withLockTimeout + `
SELECT pg_advisory_lock($1) FROM timeout`
	sqlLockSharedProven = withLockTimeout + `
SELECT pg_advisory_lock_shared($1) FROM timeout`
)

// sqlHolders reads the sessions holding key $1, as JSON, after a failed
// try (HeldError).
const sqlHolders = `SELECT json_agg(r) FROM (` + sqlLockRows + `) AS r WHERE r.key = $1 AND r.granted`

// sqlReleaseAll releases every session-level advisory lock of the session
// answering if it is backend $1, and reports whether it then holds and
// awaits none: what a refused wait's session must show before it goes back
// to the pool (keep). A set's refused wait holds the keys before the
// refused one, and a lock_timeout that fires as the lock is granted still
// ends the statement with SQLSTATE 55P03, the lock held (PostgreSQL keeps
// the timeout's cancel pending past the grant). CASE orders the steps: the
// pid first, then the release (which returns void, never NULL), then the
// read of pg_locks (an InitPlan, run when its branch is reached).
const sqlReleaseAll = `
SELECT CASE WHEN pg_backend_pid() <> $1 THEN false
            WHEN pg_advisory_unlock_all() IS NULL THEN false
            ELSE NOT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND pid = $1) END`

// sqlCancelWaiter cancels the statement of backend $1 if, and only if, it
// is waiting for one of the advisory locks $2 in this database, and says
// whether it did: the fallback for an abandoned wait whose cancel request
// was lost. The key condition keeps it from touching anything else, such
// as an unrelated backend whose pid a pooler's client-side key happens to
// equal.
const sqlCancelWaiter = `
SELECT coalesce(bool_or(pg_cancel_backend(pid)), false) FROM (` + sqlLockRows + `) AS r
 WHERE r.pid = $1 AND r.key = ANY ($2::int8[]) AND NOT r.granted`

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
