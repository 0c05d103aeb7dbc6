// Package pglock provides session-scoped PostgreSQL advisory locks that never
// leak, and transaction-scoped ones for code already inside a transaction.
//
// # When to use it
//
// Use pglock for short critical sections whose only shared state is in this
// PostgreSQL, or for "only one replica at a time" work measured in seconds
// to minutes: running migrations, a batch job, a cache rebuild. The lock is
// held by a database session, so it ends exactly when the session does;
// there is no TTL to tune and nothing to clean up after a crash.
//
// Prefer a lease (package leases) when the work is long, when it must
// survive reconnects, when stale holders must be fenced off (package
// fencing), or when a transaction-mode pooler sits between you and the
// server. Prefer XactLock when the critical section is one transaction.
//
//	locker := pglock.New(pool)
//	err := locker.Do(ctx, "billing/nightly-report", func(ctx context.Context) error {
//		return runReport(ctx) // ctx is cancelled if the lock is lost
//	})
//
// # Names and keys
//
// A lock is named by a string of 1 to 200 bytes of valid UTF-8 without NUL.
// Key(name) maps it to the bigint that pg_advisory_lock takes: the first 8
// bytes of SHA-256(name), big-endian. The SQL function pgfence.lock_key(name)
// (migration 1) computes the same value, so operators can contend from psql:
//
//	SELECT pg_advisory_lock(pgfence.lock_key('billing/nightly-report'));
//
// In pg_locks such a lock appears with locktype 'advisory', classid = the
// high 32 bits of the key, objid = the low 32 bits, objsubid = 1.
//
// # State model
//
// A Lock is held from the moment Lock, TryLock, RLock or TryRLock returns it
// until exactly one of:
//
//   - Unlock: the lock is released and the connection returns to the pool;
//     Done closes and Err returns ErrUnlocked;
//   - loss: the session died or stopped answering; Done closes and Err
//     returns ErrLost. Unlock then returns an error wrapping ErrLost.
//
// Done closing is the signal to stop the critical section. Do ties this to a
// context: fn's context is cancelled with cause ErrLost.
//
// # Invariants
//
// Each held Lock pins one pooled connection (session) for its whole life, so
// two Lock calls on one name exclude each other even inside one process
// (advisory locks are re-entrant per session, but no two Locks share one).
// A blocking acquire also occupies a connection while it waits: size the
// pool for the locks held and awaited at once, plus other work. pgxpool's
// Close waits for every pinned connection, so Unlock every Lock (or use Do).
//
// The connection-destroy rule: a connection goes back to the pool only when
// its lock state is certain — after a TryLock that PostgreSQL refused, or an
// unlock that PostgreSQL confirmed (pg_advisory_unlock returned true).
// Whenever the state is in doubt — an acquire that failed or was cancelled
// (PostgreSQL may grant the lock at the very moment the client gives up), an
// unlock that failed or returned false, a failed liveness check — the
// connection is taken out of the pool and closed. Closing the session
// releases every session lock it held, so a lock is never left behind on a
// pooled connection for the next borrower to hold unknowingly.
//
// A cancelled waiter's session is closed by the client at once; the server
// notices when the wait ends (pgx also sends a cancel request), so for a
// moment after Lock returns the server may still list that session in
// pg_locks. It never belongs to the pool.
//
// # Loss detection
//
// While a lock is held, a monitor watches its session without using any
// round trips: it blocks reading the idle connection, on which PostgreSQL
// sends nothing unless the session ends. pg_terminate_backend, a server
// shutdown or crash, or a reset connection therefore close Done within
// milliseconds of the socket learning of it (the monitor starts 50ms after
// the grant, so a session killed earlier is noticed at that point; short
// holds never pay for a monitor). After each liveness interval without
// traffic the monitor sends one empty query with the liveness timeout, which
// catches a network that has gone silent: Done closes within interval +
// timeout (1s + 3s by default; see WithLivenessCheck).
//
// Loss means this process can no longer rely on the lock; it does not mean
// another process already has it. After a terminated backend the server has
// released it; behind a silent network the server may keep the session (and
// the lock) until its own TCP timeouts fire. Either way, stop working on
// Done, and make side effects idempotent or fenced: a lock is a mutual
// exclusion hint with a prompt loss signal, not a guarantee about effects
// outside the database.
//
// # Failure handling
//
// Errors are wrapped with the operation and name and matched with errors.Is:
// ErrLocked (TryLock, TryRLock: held by another session), ErrLost,
// ErrUnlocked, ErrInvalidName, ErrNilPool, and the context's error when ctx
// ends. Bad input (invalid name, nil pool, nil or already-ended context)
// returns an error before any connection is taken. New never fails: a nil
// pool or an invalid option makes every call of that Locker return the
// error. Unlock is safe to repeat; only the first call does anything and
// later calls return its result.
//
// # Metrics
//
// A Locker records through the OpenTelemetry metric API on the provider of
// WithMeterProvider (default: the global one, which records nothing until
// the application installs an SDK provider). The package never depends on
// an SDK or exporter. Instruments, created once in New:
//
//	pgfence.lock.wait.duration  histogram, s   mode, try, outcome
//	pgfence.lock.hold.duration  histogram, s   mode, outcome
//	pgfence.lock.lost           counter, {lock} mode, cause
//
// mode is exclusive or shared; try is true for TryLock and TryRLock. The
// wait runs from the call (after input validation) to the grant or the
// failure, taking a pooled connection included; its outcome is acquired,
// locked (Try*: held elsewhere), canceled (ctx ended) or error. The hold
// runs from the grant to Unlock (outcome unlocked) or to the loss (outcome
// lost). lost counts each held lock that was lost, by cause: session_ended
// (the server closed or reset the session: pg_terminate_backend, shutdown,
// crash), liveness_failed (the liveness check failed or timed out), or
// not_held (Unlock found that the session no longer held it). With
// WithNameAttribute(true) every measurement also carries name, the lock
// name; it is off by default because each name is a separate time series.
// XactLock and TryXactLock have no Locker and record nothing.
//
// Logs (WithLogger; discarded by default): "pglock: lock acquired" and
// "pglock: lock released" at Debug, "pglock: lock lost" at Warn, with the
// attributes name, key, pid, mode, cause, waited or held.
//
// # PgBouncer and other transaction-mode poolers
//
// Session advisory locks do not work through a pooler in transaction mode:
// the server session that holds the lock is handed to other clients between
// transactions, and the lock's loss detection watches the wrong thing. Use
// XactLock/TryXactLock (released at the end of the transaction) or a lease
// there, or connect pglock directly or through session-mode pooling.
//
// pglock detects such a pooler where PostgreSQL lets it: the lock
// statement returns the answering backend's pid, and when that is not the
// pid the connection was opened to (PgBouncer hands clients keys of its
// own), a second statement checks that the session now answering holds the
// lock. If it does not, the connection is destroyed and the call returns
// ErrPooler. The check is conclusive only when it fails: an idle pooler may
// hand a lone client the same server session again. A direct connection
// pays nothing for it.
//
// # Standbys
//
// A hot standby grants advisory locks, but they exclude nobody on the
// primary. Every acquiring statement carries WHERE NOT pg_is_in_recovery(),
// so on a standby no lock is taken and the call returns ErrStandby.
package pglock
