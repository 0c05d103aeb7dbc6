package main

// SQL the command runs itself; the packages it drives keep their own.

// sqlSchemaPresent reports whether pgfence's lease table exists.
const sqlSchemaPresent = `SELECT to_regclass('pgfence.leases') IS NOT NULL`

// sqlNow is the database clock, against which lease expiry is judged.
const sqlNow = `SELECT clock_timestamp()`

// sqlLeaseExpired reads whether lease $1's last grant has expired (no
// row: it was never granted).
const sqlLeaseExpired = `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = $1`

// Demo schema. The demo's side effect is one row per period in a table
// protected by the fence guard.
const (
	// sqlDemoSetupLock serialises demo set-up among workers started at once.
	sqlDemoSetupLock = `SELECT pg_advisory_xact_lock(pgfence.lock_key('pgfence_demo/setup'))`
	sqlDemoDrop      = `DROP SCHEMA IF EXISTS pgfence_demo CASCADE`
	sqlDemoSchema    = `CREATE SCHEMA IF NOT EXISTS pgfence_demo`
	sqlDemoTable     = `
CREATE TABLE IF NOT EXISTS pgfence_demo.periods (
    period     int         PRIMARY KEY,
    worker     text        NOT NULL,
    fence      bigint      NOT NULL DEFAULT 0,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`
	sqlDemoProtected = `
SELECT EXISTS (SELECT 1 FROM pg_trigger
                WHERE tgrelid = 'pgfence_demo.periods'::regclass AND tgname = 'pgfence_guard')`
	demoTable = "pgfence_demo.periods"

	// sqlDemoDone reports whether period $1 has been done.
	sqlDemoDone = `SELECT EXISTS (SELECT 1 FROM pgfence_demo.periods WHERE period = $1)`
	// sqlDemoNext is one past the highest period done.
	sqlDemoNext = `SELECT coalesce(max(period), 0) + 1 FROM pgfence_demo.periods`
	// sqlDemoWrite is the period's side effect; the guard stamps the fence.
	sqlDemoWrite = `INSERT INTO pgfence_demo.periods (period, worker) VALUES ($1, $2) RETURNING fence`
	// sqlDemoRows reads the outcome.
	sqlDemoRows = `SELECT period, worker, fence FROM pgfence_demo.periods ORDER BY period`
)

// sqlLeases reads every row of the lease table for `leases ls`, expired
// ones too (the leases package's List reads live grants only).
const sqlLeases = `
SELECT name, owner, fence, acquired_at, renewed_at, expires_at, metadata
  FROM pgfence.leases
 ORDER BY name`

// sqlLongLeases lists the unexpired leases of pgfence.lease_status
// (migration 2) held longer than $1, longest first. Durations come back as
// seconds so that they need no interval decoding.

const sqlLongLeases = `
SELECT s.name, s.owner, s.fence, s.acquired_at, s.renewed_at, s.expires_at, s.expired,
       extract(epoch FROM s.expires_in)::float8 AS expires_in_seconds,
       extract(epoch FROM s.held_for)::float8   AS held_for_seconds,
       l.metadata
  FROM pgfence.lease_status AS s
  JOIN pgfence.leases AS l ON l.name = s.name
 WHERE NOT s.expired
   AND s.held_for > $1
 ORDER BY s.held_for DESC, s.name`

// sqlBlockedTakeovers lists the sessions in this database that have
// waited longer than $1 for a lease's fence lock (1885824614,
// hashtext(lease); see pgfence.token_fence): takeovers and force-releases
// held back by an expired holder's open fenced transaction. Each row names
// the lease (the names of pgfence.lease_status with that hash), the
// backends holding the lock, and the prepared transactions holding it,
// which have no backend.
const sqlBlockedTakeovers = `
SELECT coalesce((SELECT string_agg(s.name, ', ' ORDER BY s.name) FROM pgfence.lease_status AS s
                  WHERE pg_catalog.hashtext(s.name)::oid = w.objid), '') AS lease,
       w.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), w.waitstart,
       extract(epoch FROM clock_timestamp() - w.waitstart)::float8 AS waited_seconds,
       coalesce((SELECT array_agg(k.pid ORDER BY k.pid) FROM pg_locks AS k
                  WHERE k.pid IS NOT NULL AND ` + fenceLockOf + `), '{}') AS held_by,
       coalesce((SELECT array_agg(p.gid ORDER BY p.prepared, p.gid) FROM pg_prepared_xacts AS p
                  WHERE EXISTS (SELECT FROM pg_locks AS x JOIN pg_locks AS k ON k.virtualtransaction = x.virtualtransaction
                                 WHERE x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL
                                   AND k.pid IS NULL AND ` + fenceLockOf + `)), '{}') AS prepared
  FROM pg_locks AS w
  LEFT JOIN pg_stat_activity AS a ON a.pid = w.pid
 WHERE w.locktype = 'advisory' AND NOT w.granted AND w.classid = 1885824614 AND w.objsubid = 2
   AND w.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())
   AND w.waitstart < clock_timestamp() - $1::interval
 ORDER BY w.waitstart, w.pid`

// fenceLockOf matches the pg_locks rows k that hold the lock w waits for.
const fenceLockOf = `k.locktype = 'advisory' AND k.granted AND k.classid = w.classid AND k.objid = w.objid
                                   AND k.objsubid = w.objsubid AND k.database = w.database`

// sqlTerminate ends the backends $1 (bigint[]) and waits up to 5s for each
// to exit; it returns how many it ended.
const sqlTerminate = `SELECT count(*) FILTER (WHERE pg_terminate_backend(p::int, 5000)) FROM unnest($1::bigint[]) AS p`

// sqlUnguarded lists tables below a protected table that lack a guard
// trigger (migration 4; EXECUTE is pgfence_operator's).
const sqlUnguarded = `SELECT tbl::text, parent::text, missing FROM pgfence.unguarded()`
