// Package migrations holds pgfence's SQL schema as golang-migrate migration
// files, embedded in FS, and applies them with Up, Down and Version.
//
// # The schema
//
// Migration 1 creates schema pgfence with:
//
//   - pgfence.leases, one row per lease name, expiry judged by the database
//     clock;
//   - pgfence.lock_key(name), the advisory-lock key of a name (equal to
//     pglock.Key);
//   - pgfence.fence_guard() and pgfence.protect(table, fence_column), the
//     trigger that makes a table reject writes from stale holders.
//
// Migration 2 adds the view pgfence.lease_status (held_for, expires_in,
// expired, by the database clock) for SQL-based monitoring.
//
// Migration 3 added fence epochs (a sequence skipped ahead per timeline);
// migration 4 replaces them, because two promotions to the same timeline
// number and a restore within one cluster defeated them:
//
//   - fences come from the database clock, per lease: greatest(the lease's
//     previous fence + 1, microseconds since the Unix epoch,
//     pgfence.fence_floor + 1), so they exceed every fence a lost history
//     (a failover, a restore, a rollback) issued; pgfence.bump_fence(gap)
//     raises the floor when a server's clock may have been behind;
//   - grants, renewals and releases go through SECURITY DEFINER functions
//     (try_acquire, renew, renew_many, release, release_many,
//     force_release); application roles never write pgfence.leases;
//   - roles pgfence_client (an application: GRANT pgfence_client TO app)
//     and pgfence_operator (plus force-release, fence bump, the checks);
//   - pgfence.declare_token(lease, fence), the way to declare a fencing
//     token, bound to the current transaction; the guard honours nothing
//     else, and only a lease's current, unexpired grant;
//   - the guard covers inheritance children, refuses TRUNCATE under
//     row-level security, and pgfence.unguarded() lists tables added below a
//     protected table after protect ran.
//
// Migration 5 adds lease data and hand-over requests; migration 6
// once-per-period records, minimum holds and semaphores. Migrations 7 to 10
// make grants and fenced writes cheaper without changing what they check.
// Migration 11 makes pgfence.grant_roles() grant migration 5's functions
// too (for roles created after the migrations). Migration 12 adds the
// procedure pgfence.declare(lease, fence): the same declaration, run by
// CALL, which PostgreSQL neither plans nor answers with a row; package
// fencing declares with it and needs migration 12. Migration 13 lets a
// table's owner that is a pgfence_client protect it (before, only the
// migration role could), and revokes write privileges on pgfence's tables
// granted on columns, which migration 4 missed. Migration 14 fixes two
// answers of the guard under REPEATABLE READ and SERIALIZABLE: a holder
// whose lease was renewed after the snapshot gets a serialization failure
// to retry, not PF001, and TRUNCATE of a protected table is refused there.
// Migration 15 makes pgfence.protect refuse a generated fence column,
// which PostgreSQL computes after the guard's stamp.
// Migration 16 re-creates pgfence.lock_key and pgfence.unguarded, whose
// SQL bodies were parsed with the migration role's search path: a
// look-alike of a built-in that another role had put on it stayed bound
// to them. Up and Down run every file with pg_catalog alone on the path.
// Migration 17 adds pgfence.prune(older_than_us, max_rows), for
// operators: it deletes lease rows expired long ago and raises the fence
// floor to the highest fence it deletes. Migration 18 makes
// pgfence.unguarded() list a partition detached from a protected table,
// which keeps its TRUNCATE guard but loses the row guard. Migration 19
// makes a takeover wait for the former holder's fenced transaction
// whatever lock_timeout the session has (a role's default ended it).
//
// Each migration file argues its rules; docs/design.md has the threat
// model.
//
// # Bookkeeping
//
// golang-migrate records the applied version in the table named by Table
// (pgfence_schema_migrations) in the connection's current schema, so that
// pgfence's history never collides with an application that also uses
// golang-migrate with the default schema_migrations.
//
// # Applying with the upstream CLI
//
// The migrations directory of the repository is a plain golang-migrate
// source. Operators who prefer the upstream migrate CLI (built with the
// pgx5 tag) run:
//
//	migrate -path ./migrations \
//	  -database 'pgx5://app@db:5432/app?x-migrations-table=pgfence_schema_migrations' up
//
// Up, Down and Version do what the CLI's up, down and version do, but
// with pg_catalog alone on the search path (see above), and Down refuses
// (ErrDownRefused) before reverting anything where the CLI's down would
// fail part-way. A file that the server refuses (a lock_timeout, a
// deadlock, an object in the way) commits nothing, each file being one
// transaction: Up and Down then leave the version as it was, clean, where
// the CLI leaves it dirty for an operator to force. Only a file whose
// outcome is unknown (the connection lost as it ran) leaves it dirty
// (ErrDirty); Force records the version an operator has found by hand,
// as the CLI's force does. Up is safe to run concurrently from many
// processes (each replica at start-up, say), and beside the CLI: they
// serialise on golang-migrate's advisory lock.
//
// # Privileges
//
// Applying a migration needs the migration role: one that may create
// schema pgfence (and owns it afterwards), create the bookkeeping table
// in its schema the first time, and create roles (migration 4). A role
// that may not create the roles (or, in a later database, grant or drop
// them) still migrates; each migration says what it left undone in a
// NOTICE, which WithNotices passes on. When the
// schema is current, Up and Version need only SELECT on the bookkeeping
// table (and USAGE on its schema): the advisory lock needs no privilege,
// and the table is created only when missing. A replica that runs Up at
// start-up as a least-privileged application role (a member of
// pgfence_client, which holds nothing outside schema pgfence) fails with
// SQLSTATE 42501 unless it is granted that SELECT
// (GRANT SELECT ON pgfence_schema_migrations TO pgfence_client), and fails
// all the same when a migration is pending: apply migrations in a deploy
// step, as the migration role.
package migrations
