// Package fencing makes stale lock holders harmless: PostgreSQL itself
// rejects writes to protected rows that carry an outdated fence.
//
// # The problem
//
// A lock or lease alone cannot stop a holder that does not know it has lost.
// Kleppmann's example: client A acquires a lease, then stalls — a long GC
// pause, SIGSTOP, a swapped-out VM — for longer than the TTL. The lease
// expires, client B acquires it and starts writing. A wakes up, still
// believing it holds the lease, and writes too. No amount of checking on
// A's side closes this gap: A can be paused between its check and its
// write. Only the resource can refuse A's write, and only if every write
// carries proof of which grant it was made under.
//
// # The token
//
// That proof is a Token: the fence of a lease grant, and the lease's name.
// Every grant of a lease gets a higher fence than the one before — the
// database clock in microseconds, raised past the previous fence — so a
// later holder always carries a higher fence (leases.Lease.Token returns
// it), even after a failover or a restore lost grants. A transaction
// declares its token with Begin or InTx, which run
//
//	CALL pgfence.declare($1, $2)
//
// (in the same round trip as BEGIN where they can, and InTx with the
// transaction's first statement too). SQL clients do the
// same, or SELECT pgfence.declare_token($1, $2) where only a query can go.
// The declaration is bound to the transaction's id: it ends with the
// transaction and is honoured by no other — not by a later transaction on
// a pooled connection, not when set with SET or PGOPTIONS for the session.
// (A session that deliberately SETs it for the id the next transaction will
// get can make that transaction's undeclared writes pass; it needs a
// current token, which it could as well declare: the binding catches
// forgotten declarations, not hostile sessions.)
//
// # The guard
//
// Protect installs pgfence.fence_guard on a table with a `fence bigint`
// column. For every INSERT, UPDATE and DELETE of a row (COPY FROM and
// INSERT … ON CONFLICT included — they fire row triggers) the guard
//
//	(a) rejects the write if the transaction declares no token for itself
//	    (PF002, ErrNoToken);
//	(b) rejects a token lower than the fence stored in the row (PF001, ErrStale);
//	(c) rejects the token unless it is its lease's current fence and
//	    unexpired by the database clock (PF001) — so only fences that were
//	    issued, and are still held, can write — and holds the lease's fence
//	    lock (shared) until the transaction ends;
//	(d) stores the token's fence in the row, whatever the write set it to.
//
// TRUNCATE fires no row triggers, so Protect also installs a BEFORE TRUNCATE
// statement trigger: it applies (a), (c), and (b) against the highest fence
// in the table and below it; under row-level security it refuses, since the
// writer cannot see every row it would remove, and so it does outside READ
// COMMITTED (SQLSTATE 0A000), since the snapshot hides rows committed after
// it, which TRUNCATE removes too. Protect covers inheritance children and
// partitions.
//
// Rule (b) alone stops A once B has written the row; rule (c) also stops A
// when it writes first — in the window after its lease expired but before
// B's first write — and for rows B never touches. Rule (b) reads whatever
// fence the row holds, whichever lease wrote it: a row written under two
// leases sides with the later grant, and a holder of the earlier one gets
// ErrStale there while its lease is current (fences of different leases
// follow the clock). Give each protected row one lease.
//
// # The fence lock
//
// Rule (c) checks the lease at the moment of the write, but the transaction
// commits later. The fence lock closes that window: before it checks, the
// guard takes the lease's fence lock — a transaction-level advisory lock —
// shared, and a grant that takes the lease over from an expired or
// force-released holder, and a force-release, take it exclusively. So they
// wait until the fenced transaction ends. Either the transaction commits
// before the next grant — and the next holder, reading after its grant, sees
// its writes — or the grant came first, and the guard's read, taken after
// the lock was granted, finds another fence and rejects the write. Never
// both. Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot
// may predate the grant, so there the guard also share-locks the lease row,
// and the case surfaces as a serialization failure (SQLSTATE 40001) instead
// of PF001; the write does not commit either way. So does any change to the
// lease row after the snapshot — the holder's own renewal included, which
// is not a loss: retry the transaction.
//
// An advisory lock lives in the lock manager: many writers under one lease
// share it without writing WAL or creating MultiXacts, and renewals and
// releases never wait for it. Takeovers and force-releases do: keep fenced
// transactions short compared with the lease's TTL. A transaction that
// outlasts the holder's local deadline costs the holder its lease, safely:
// its writes commit before anyone else is granted the lease, or are
// rejected. A frozen holder's open transaction holds the next grant back
// until it ends: leases.Client.ForceRelease names it and
// `pgfence leases release --force --terminate` ends it. A prepared
// transaction (two-phase commit) holds it until COMMIT PREPARED or
// ROLLBACK PREPARED, with no session to end; ForceRelease names it by its
// GID.
//
// # Errors
//
// InTx maps a PF001 rejection, from fn or from COMMIT, to a *StaleError:
// errors.Is(err, ErrStale) is true, and errors.As still finds the
// *pgconn.PgError, whose Message says which rule fired. IsStale recognises
// both that and a raw PF001 *pgconn.PgError (from Begin's transaction or
// plain SQL). A missing or malformed token is PF002: ErrNoToken, IsNoToken —
// a programming error, not a lost lease, so IsStale is false for it. Once a
// holder sees ErrStale it has lost: the same token will never be accepted
// again. Stop, and let the current holder do the work.
//
// # database/sql
//
// BeginDB and InDBTx are Begin and InTx on a *sql.DB, *sql.Conn or
// *sqlx.DB (SQLBeginner): BEGIN, then pgfence.declare in a second
// round trip. Rejections map to ErrStale and ErrNoToken whichever driver
// reports them: IsStale and IsNoToken read the SQLSTATE of a
// *pgconn.PgError and of any error with a SQLState method (lib/pq's
// *pq.Error). A GORM transaction is fenced by running the declaration as
// its first statement.
//
// # Telemetry
//
// InTx reports through the OpenTelemetry API only. It counts each
// rejection it returns on the counter pgfence.fenced_writes.rejected (unit
// {write}, attribute reason = stale for ErrStale, no_token for
// ErrNoToken), and runs in a span pgfence.fenced_tx (attributes
// pgfence.lease.name and pgfence.lease.fence), whose status is an error
// when InTx returns one, and when fn panics (the transaction is rolled
// back and the panic goes on).
//
// The providers are set as in pglock and leases, with WithMeterProvider
// and WithTracerProvider, defaulting to the global ones; but the package
// has no client object to hold them, so InTx takes them on each call.
// Build the options once, next to the pool, and pass them to every call:
//
//	fenced := []fencing.Option{fencing.WithMeterProvider(mp), fencing.WithTracerProvider(tp)}
//	err := fencing.InTx(ctx, pool, l.Token(), fn, fenced...)
//
// Building an Option creates its instrument or tracer, so InTx looks
// nothing up: a transaction that is not rejected records nothing, and
// without a tracer provider (the global one, until the application
// installs one) InTx starts no span and allocates nothing for it. A
// package-level setter would have been global state of the package's own,
// which two libraries or tests sharing a process could not keep apart;
// whoever wants global configuration has the global providers.
// leases.Client.OnceTx passes its Client's providers.
//
// Only InTx sees the outcome of fn and COMMIT: rejections of statements
// run on a transaction from Begin, and of plain guarded SQL, are not
// counted — count them where you call IsStale. An InTx nested in another
// InTx's fn (a savepoint) counts its rejection at each level.
//
// # What is guaranteed, and where
//
// For rows in this PostgreSQL database, in protected tables: a write made
// under a stale token does not commit, however long its author was paused.
// The database clock judges expiry; no clock of any client matters.
//
// For anything outside this database — an object store, a payment API,
// another database — nothing here helps by itself. Pass the fence along and
// make the external system reject writes whose fence is lower than the
// highest it has seen (a conditional write, a version column), or make the
// effect idempotent.
//
// # Without triggers
//
// Users who cannot install triggers can guard each statement themselves. The
// row comparison, rule (b) (zero rows affected means stale, or no such row):
//
//	UPDATE accounts SET balance = $2, fence = $3
//	 WHERE id = $1 AND fence <= $3
//
// That alone does not stop a stale holder that writes before its successor
// does. Adding rule (c) and its fence lock, as pgfence_client may: declare
// the token, then have pgfence.token_fence check it (it raises PF001 or
// PF002, and holds the fence lock until the transaction ends):
//
//	CALL pgfence.declare($4, $3);   -- in the same transaction
//	UPDATE accounts SET balance = $2, fence = pgfence.token_fence('accounts')
//	 WHERE id = $1 AND fence <= $3
//
// Every write must be written this way; the guard exists so that forgetting
// one is an error rather than a silent hole.
//
// # Residual risks
//
//   - Triggers can be switched off. The table's owner or a superuser can
//     ALTER TABLE … DISABLE TRIGGER; a superuser can SET
//     session_replication_role = replica, under which ordinary triggers do
//     not fire (logical replication's apply worker and
//     pg_dump --disable-triggers restores run that way). To guard even
//     then, ALTER TABLE … ENABLE ALWAYS TRIGGER pgfence_guard — which also
//     makes the guard reject replicated writes on a logical-replication
//     subscriber, so decide per table.
//   - Fencing is not authorisation: a role with pgfence_client can take any
//     free lease, and can read any holder's (name, fence) from
//     pgfence.leases and write under that token. The guard stops stale
//     holders, not authorised roles that misbehave (docs/design.md,
//     "Threat model").
//   - Fences are only as durable as the database: after a failover to an
//     asynchronous replica, recent grants and fenced writes can be lost;
//     fences drawn afterwards still exceed the lost ones (they follow the
//     database clock), so a lost grant's holder is rejected.
//   - The guard checks tokens with the writer's privileges: it reads
//     pgfence.leases, or under REPEATABLE READ and SERIALIZABLE calls the
//     SECURITY DEFINER function pgfence.token_fence, so a writer needs
//     pgfence_client; without it the write fails with a permission error
//     (42501), or PF002 when it declares nothing — it is never let through.
package fencing
