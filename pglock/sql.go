package pglock

// The statements pglock runs, in one place. Every one takes the lock key
// ($1, a bigint from Key) as its only parameter; names never reach SQL text.
const (
	// Session-scoped, on the Lock's pinned connection.
	sqlLock          = `SELECT pg_advisory_lock($1)`
	sqlLockShared    = `SELECT pg_advisory_lock_shared($1)`
	sqlTryLock       = `SELECT pg_try_advisory_lock($1)`
	sqlTryLockShared = `SELECT pg_try_advisory_lock_shared($1)`
	sqlUnlock        = `SELECT pg_advisory_unlock($1)`
	sqlUnlockShared  = `SELECT pg_advisory_unlock_shared($1)`

	// Transaction-scoped, on the caller's transaction.
	sqlXactLock    = `SELECT pg_advisory_xact_lock($1)`
	sqlTryXactLock = `SELECT pg_try_advisory_xact_lock($1)`
)
