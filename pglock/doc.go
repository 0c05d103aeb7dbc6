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
//	locker, err := pglock.New(pool)
//	if err != nil {
//		return err // a nil pool or an invalid option: ErrInvalid
//	}
//	err = locker.Do(ctx, "billing/nightly-report", func(ctx context.Context, lk *pglock.Lock) error {
//		return runReport(ctx) // ctx ends (cause ErrLost) if the lock is lost
//	})
//
// Locker.Do mirrors leases.Client.Run, Lock.Context mirrors
// leases.Lease.Context, WithUnlockTimeout mirrors the leases release
// timeout, and *HeldError mirrors leases.HeldError.
//
// # Names and keys
//
// A lock is named by a string of 1 to 200 bytes of valid UTF-8 without NUL
// (the rules lease names follow). Key(name) maps it to the bigint that
// pg_advisory_lock takes: the first 8 bytes of SHA-256(name), big-endian.
// The SQL function pgfence.lock_key(name) (migration 1) computes the same
// value, so operators can contend from psql:
//
//	SELECT pg_advisory_lock(pgfence.lock_key('billing/nightly-report'));
//
// In pg_locks such a lock appears with locktype 'advisory', classid = the
// high 32 bits of the key, objid = the low 32 bits, objsubid = 1. A key
// cannot be turned back into a name: List and Get report keys.
//
// # Several names
//
// LockAll and TryLockAll take a set of names at once, exclusively, on one
// session, and return one Lock for the set: Names lists them, Unlock
// releases them all, and the loss of the session loses them all.
// XactLockAll and TryXactLockAll do the same in transaction scope. The
// caller's order does not matter and a name given twice counts once:
// the keys are taken in ascending Key order, in one statement.
//
// All or none. A try that finds one name held gives back the names it
// took before it (TryXactLockAll rolls back to a savepoint, which releases
// transaction locks taken after it) and reports the first name held. A
// blocking call that fails part-way keeps none of the set: in session
// scope its session gives back what it took before the call returns (a
// wait the server refused: see the connection-destroy rule) or is
// destroyed, and the server frees them as it exits; in transaction scope
// the caller must roll back.
//
// Each name held takes a slot of PostgreSQL's shared lock table, which
// every session's locks share: max_locks_per_transaction ×
// (max_connections + max_prepared_transactions) slots, and some slack. A
// set larger than what is left fails with SQLSTATE 53200 ("out of shared
// memory") and keeps nothing: in session scope the session gives back
// what it took before the call returns. Its error quotes its first names
// only.
//
// No deadlock, with one rule: ask for all the locks you need at once, and
// ask for none while you hold one. Every call that waits then holds only
// keys below the one it waits for, so no circle of waiters can form,
// whatever mix of LockAll, XactLockAll, Lock, RLock and XactLock the
// callers use. A caller that holds a lock (a Lock, or an earlier XactLock
// in the same transaction) and asks for another can deadlock with one
// doing the same in the other order: PostgreSQL then aborts one of the
// waits with SQLSTATE 40P01 after deadlock_timeout. Two Locks of one
// process do not share a session, so a goroutine that holds "a" and asks
// for a set containing "a" waits for itself, which PostgreSQL cannot see,
// until ctx ends.
//
// # State model
//
// A Lock is held from the moment Lock, TryLock, RLock, TryRLock, LockAll or
// TryLockAll returns it until exactly one of:
//
//   - Unlock: the lock is released and the connection returns to the pool;
//     the Lock's Context ends with cause ErrUnlocked;
//   - loss: the session died or stopped answering; the Context ends with
//     cause ErrLost, and Unlock then returns an error wrapping ErrLost. An
//     Unlock that finds the session gone before the monitor did reports
//     the loss the same way.
//
// The Context ending (Done closing) is the signal to stop the critical
// section. Do ties this to fn's context.
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
// its lock state is certain — after a TryLock that PostgreSQL refused, an
// unlock that PostgreSQL confirmed (pg_advisory_unlock returned true), or a
// wait that the server itself ended (its lock_timeout, which carries ctx's
// deadline, a deadlock, a full lock table) or granted just as ctx's
// deadline passed, before pglock sent anything to end it, once the same
// session has released every advisory lock it held and shown in pg_locks
// that it holds none: a set's names before the refused one, the refused
// name itself when a lock_timeout fired as it was granted (the statement
// then fails with the lock held), and a late grant (the call returns ctx's
// error). Whenever the state is in doubt — any other acquire that failed or
// was abandoned (PostgreSQL may grant the lock at the very moment the
// client gives up; a cancel request may arrive after the statement it was
// meant for), an unlock that failed or returned false, a failed liveness
// check — the connection is taken out of the pool and closed. Closing the
// session releases every session lock it held, so a lock is never left
// behind on a pooled connection for the next borrower to hold unknowingly.
//
// An abandoned wait never leaves a backend waiting. A backend waiting for a
// lock does not read its socket, so closing the connection alone would
// leave it queued behind the holder. When ctx ends during Lock or RLock,
// the call returns only once the server has ended the wait: a deadline
// travels with the statement as its lock_timeout (the server ends the wait
// by itself); otherwise pglock sends a cancel request and waits for the
// answer, and if the request is lost (or came before the statement, which
// the server ignores) it cancels that backend from another of the pool's
// connections (pg_cancel_backend, only while it waits for this key; tried
// again until it does). All of it is bounded by the unlock timeout; if
// nothing answers by then, the connection is closed and the server ends
// the wait when it next looks at the session. XactLock and XactLockAll run
// on the caller's transaction, with no connection to spare: a deadline
// travels with them the same way, and without one the wait ends as the
// driver ends it (pgx sends a cancel request, and closes the connection);
// if that request is lost, the backend waits until the lock is granted,
// unless the server's client_connection_check_interval ends it once the
// connection is closed (docs/production.md, "Session settings").
//
// A statement_timeout that the role or database sets ends a wait whatever
// ctx allows (the server starts its timer before the statement runs), as
// does PostgreSQL 17's transaction_timeout (with the session), and without
// a deadline the session's lock_timeout bounds it: the error's text then
// names the setting (docs/production.md, "Session settings").
//
// # Loss detection
//
// While a lock is held, one goroutine per Lock watches its session without
// using any round trips: it blocks reading the idle connection, on which
// PostgreSQL sends nothing unless the session ends. pg_terminate_backend, a
// server shutdown or crash, or a reset connection therefore end the Context
// within milliseconds of the socket learning of it (the watch starts 50ms
// after the grant, so a session killed earlier is noticed at that point;
// short holds never read the socket). After each liveness interval without
// traffic it sends one empty query with the liveness timeout, which catches
// a network that has gone silent: the Context ends within interval +
// timeout (1s + 3s by default; see WithLivenessCheck). Unlock stops the
// goroutine and waits for it: at once, or after a liveness query in
// flight.
//
// Loss means this process can no longer rely on the lock; it does not mean
// another process already has it. A terminated backend releases it as its
// session exits, a moment after the error that reported the loss (a TryLock
// at once may still find it held); behind a silent network the server may
// keep the session (and the lock) until its own TCP timeouts fire. Either
// way, stop working when the Context ends, and make side effects idempotent
// or fenced: a lock is a mutual exclusion hint with a prompt loss signal,
// not a guarantee about effects outside the database.
//
// # Failure handling
//
// Errors are matched with errors.Is and errors.As:
//
//   - ErrInvalid: bad input (a name, a nil pool, context, callback,
//     transaction, Locker or Lock, an invalid option), before anything is
//     taken. The text names the argument: "pglock: invalid name: must be
//     1..200 bytes, got 0". New fails with it; nothing panics on nil.
//   - *HeldError, matching ErrLocked: TryLock and TryRLock found the lock
//     held; it lists the holders' sessions (pid, application_name, client
//     address, state and since when), read on the same connection.
//     TryLockAll wraps it with the set: pglock: try lock all ["a" "b"]:
//     lock "b" held by pid 4242 (...).
//   - ErrLost, ErrUnlocked: the causes of a Lock's Context.
//   - ErrStandby: the server is in recovery; no lock was taken.
//   - ErrPooler: a transaction-mode pooler (see below).
//   - the context's error when ctx ends.
//
// Every error's text starts with "pglock: " once, followed by the
// operation and the name, or the set in Key order: pglock: unlock
// "billing": lock lost; pglock: lock all ["b" "a"]: context canceled. Hints for
// PostgreSQL errors come from their SQLSTATE. Unlock is safe to repeat;
// only the first call does anything and later calls return its result.
//
// # Inspecting locks
//
// List and Get report the sessions holding or awaiting advisory locks in
// the pool's database, from pg_locks and pg_stat_activity, as Info values:
// key, mode, granted or waiting, pid, application_name, client address,
// state, and the times PostgreSQL keeps (backend start, last state change,
// wait start). PostgreSQL does not record when a lock was granted. The
// pgfence command's `locks ls` and `check` print them.
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
//	pgfence.lock.held           up-down counter, {lock} mode
//
// mode is exclusive or shared; try is true for TryLock, TryRLock and
// TryLockAll (a set records as one lock, named by Name). The
// wait runs from the call (after input validation) to the grant or the
// failure, taking a pooled connection included; its outcome is acquired,
// locked (Try*: held elsewhere), canceled (ctx ended) or error. The hold
// runs from the grant to Unlock (outcome unlocked) or to the loss (outcome
// lost). lost counts each held lock that was lost, by cause: session_ended
// (the server closed or reset the session: pg_terminate_backend, shutdown,
// crash), liveness_failed (the liveness check failed or timed out), or
// not_held (Unlock found that the session no longer held it). held is
// the number of session locks the Locker holds now (a set counts once).
// With WithNameAttribute(true) every measurement but held also carries
// name, the lock name; it is off by default because each name is a
// separate time series.
// The transaction-scoped calls have no Locker and record nothing.
//
// # Logs
//
// WithLogger (discarded by default): "pglock: lock acquired" and "pglock:
// lock released" at Debug, "pglock: lock lost" at Warn, with the attributes
// name, key (keys, for a set of several), pid, mode, cause, waited or
// held; "pglock: connection destroyed" at Debug (name, pid when known,
// why); "pglock: unlock failed" at Warn when the Unlock that Do runs fails.
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
// pays for it once: after its first lock shows the pid it was opened to,
// the statements that lock one name on that connection carry neither this
// check nor the standby check (a direct connection keeps its session for
// life).
//
// # database/sql
//
// NewDB takes a *sql.DB (pgx's stdlib driver or lib/pq; GORM's and sqlx's
// unwrap to one). A Lock then pins a *sql.Conn, the destroy rule and the
// abandoned-wait rule hold as above (a doubtful connection is discarded
// through driver.ErrBadConn, so database/sql closes it), and two things
// differ: loss is found by a liveness query every interval (the socket is
// out of reach), so a terminated backend ends the Context within the
// liveness interval + timeout rather than milliseconds; and a
// transaction-mode pooler is not detected.
//
// # Standbys
//
// A hot standby grants advisory locks, but they exclude nobody on the
// primary. Acquiring statements carry WHERE NOT pg_is_in_recovery(), so on
// a standby no lock is taken and the call returns ErrStandby: connect to
// the primary, for example with a multi-host connection string and
// target_session_attrs=read-write. (A direct connection that has once
// been granted a lock skips the check: a primary's session never finds
// itself on a standby, because a primary becomes one only by restarting.)
package pglock
