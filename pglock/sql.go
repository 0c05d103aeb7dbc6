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
