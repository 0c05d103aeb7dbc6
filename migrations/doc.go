// Package migrations holds pgfence's SQL schema as golang-migrate migration
// files, embedded in FS, and applies them with Up, Down and Version.
//
// # The schema
//
// Migration 1 creates schema pgfence with:
//
//   - pgfence.fence_seq, the sequence every lease grant takes its fence from;
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
// Migration 3 adds fence epochs: pgfence.next_fence(), which every lease
// grant calls, skips fence_seq ahead by 2^32 whenever the server's timeline
// or system identifier differs from the one recorded in pgfence.fence_epoch
// (a promoted standby, a restored dump), so a failover that lost the tail
// of the WAL never hands out an acknowledged fence again; and
// pgfence.bump_fence(gap), the operator's manual advance.
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
// Up, Down and Version are equivalent to the CLI's up, down and version.
// Up is safe to run concurrently from many processes (each replica at
// start-up, say): golang-migrate serialises them with an advisory lock.
package migrations
