// Package benchsql is the SQL a user would write by hand instead of using
// pgfence: the baseline that `pgfence bench` and the packages' benchmarks
// compare the library against. It is not the library's SQL: it has no
// failover-safe fences, no roles, no hand-over notifications and no guard.
package benchsql

// Schema creates the baseline's objects in schema pgfence_bench: the
// minimal hand-written lease (a table and a sequence) and a plain table
// for unfenced updates. Drop them with DropSchema.
const Schema = `
CREATE SCHEMA pgfence_bench;
CREATE SEQUENCE pgfence_bench.seq;
CREATE TABLE pgfence_bench.leases (
    name        text PRIMARY KEY,
    owner       text NOT NULL,
    fence       bigint NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    renewed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL
);
CREATE TABLE pgfence_bench.plain (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence bigint NOT NULL DEFAULT 0)`

// DropSchema removes what Schema created.
const DropSchema = `DROP SCHEMA IF EXISTS pgfence_bench CASCADE`

// Grant takes lease $1 for owner $2 for $3 milliseconds if it is free or
// expired, returning the new fence (no row: held).
const Grant = `
INSERT INTO pgfence_bench.leases (name, owner, fence, expires_at)
VALUES ($1, $2, nextval('pgfence_bench.seq'), clock_timestamp() + $3 * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, fence = excluded.fence,
  acquired_at = clock_timestamp(), renewed_at = clock_timestamp(), expires_at = excluded.expires_at
WHERE leases.expires_at <= clock_timestamp() RETURNING fence`

// Release ends the grant of lease $1 with fence $2.
const Release = `UPDATE pgfence_bench.leases SET expires_at = clock_timestamp() WHERE name = $1 AND fence = $2`

// FillPlain adds rows 1..$1 to the plain table.
const FillPlain = `INSERT INTO pgfence_bench.plain (id) SELECT generate_series(1, $1::int)`

// UpdatePlain is an unfenced update of row $1 (sent inside BEGIN … COMMIT).
const UpdatePlain = `UPDATE pgfence_bench.plain SET v = v + 1 WHERE id = $1`
