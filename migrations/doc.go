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
