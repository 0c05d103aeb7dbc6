package leases

// The package's SQL, in one place. Grants, renewals and releases call the
// SECURITY DEFINER functions of migration 4 (migrations/
// 000004_fence_integrity.up.sql, where each is explained): an application
// role needs pgfence_client and no privilege on the lease table itself.
// Every statement is parameterised, every time comes from the database
// clock, and TTLs travel as bigint microseconds so that no client-side
// time arithmetic is involved. Renewal and release name the exact grant —
// (name, owner, fence) — so a stale holder can never touch a newer grant.
const (
	// notifyChannel is the LISTEN/NOTIFY channel; the payload is the lease
	// name.
	notifyChannel = "pgfence_leases"

	// sqlGrant: one attempt. The row says whether it was granted, and
	// describes the new grant or else the holder; remaining_us is the time
	// to its expiry. No row: the holder committed while the call ran.
	// $4 is the new grant's data (NULL: none); holder_data is the data of
	// the grant the row describes (migration 5). statement_timestamp()
	// tells how long the server waited before it granted (grantStart).
	sqlGrant = `SELECT granted, holder, fence, acquired_at, renewed_at, expires_at, remaining_us, holder_data,
       statement_timestamp()
  FROM pgfence.try_acquire($1, $2, $3, $4)`

	// sqlEndUnread ends the grant, if any, of lease $1 (or, $3 true, of any
	// slot of semaphore $1) that owner $2 holds: a grant whose answer the
	// client could not read. The owner is drawn for one grant attempt, so
	// the row names that attempt's grant. Its count is 0 when nothing was
	// granted.
	sqlEndUnread = `SELECT count(pgfence.release(l.name, l.owner, l.fence))
  FROM pgfence.leases AS l
 WHERE l.owner = $2 AND (l.name = $1 OR $3 AND starts_with(l.name, $1 || '#'))`

	// sqlSetData replaces one grant's data. NULL: the grant is not live.
	sqlSetData = `SELECT pgfence.set_data($1, $2, $3, $4)`

	// sqlRenewBatch renews many grants in one statement (a keepalive
	// tick), skipping rows locked by someone else (busy).
	// handover says an operator asked the grant to step down (migration 5).
	sqlRenewBatch = `SELECT lease, expires_at, busy, handover FROM pgfence.renew_batch($1, $2, $3, $4)`

	// sqlRequestHandover asks the live grant of $1 to step down and
	// notifies; no row: nobody holds it.
	sqlRequestHandover = `SELECT holder, fence FROM pgfence.request_handover($1)`

	// sqlRenew renews one grant, waiting for row locks. NULL: lost.
	sqlRenew = `SELECT pgfence.renew($1, $2, $3, $4)`

	// sqlRelease ends one grant: true if it was live, false if it had
	// expired, NULL if it is gone. It commits without waiting for the WAL
	// flush (synchronous_commit off for this transaction only): a release
	// lost in a crash only delays the next holder until the grant expires,
	// as a crashed holder would, and the next synchronous commit — the
	// next grant of any lease — makes it durable, since WAL is flushed in
	// order. Releases draw no fence, so a lost one cannot reorder fences.
	sqlRelease = `SELECT pgfence.release($1, $2, $3), set_config('synchronous_commit', 'off', true)`

	// sqlReleaseDurable is sqlRelease committing as the session is
	// configured (WithDurableRelease).
	sqlReleaseDurable = `SELECT pgfence.release($1, $2, $3), ''`

	// sqlReleaseBatch ends many grants (Close, grants stopped trusting),
	// asynchronously committed like sqlRelease. It waits at most $4 (a
	// lock_timeout: '0' waits on) for any of the rows a transaction has
	// locked; the set_config sits in an argument so that it runs before
	// the function does, and lasts for this statement's transaction only.
	sqlReleaseBatch = `SELECT count(*), set_config('synchronous_commit', 'off', true)
  FROM pgfence.release_many($1, $2, CASE WHEN set_config('lock_timeout', $4, true) IS NOT NULL THEN $3::bigint[] END)`

	// sqlReleaseBatchDurable is sqlReleaseBatch committing as configured.
	sqlReleaseBatchDurable = `SELECT count(*), ''
  FROM pgfence.release_many($1, $2, CASE WHEN set_config('lock_timeout', $4, true) IS NOT NULL THEN $3::bigint[] END)`

	// sqlForceRelease expires whatever grant a lease has, waiting at most
	// $2 ms for the lease's fence lock and row. Fully durable: an operator
	// acts on its answer.
	sqlForceRelease = `SELECT pgfence.force_release($1, $2)`

	// sqlBackends is the head of the queries that describe backends, as
	// queryBackends scans them.
	sqlBackends = `SELECT a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
       a.xact_start, a.state_change
  FROM pg_stat_activity AS a
`

	// sqlBlockers describes the backends that block backend $2, a
	// force-release of lease $1, but those queued ahead of it for the
	// lease's fence lock: pg_blocking_pids lists them too, and a waiting
	// takeover is no more in the way than the force-release itself.
	sqlBlockers = sqlBackends + ` WHERE a.pid = ANY (pg_blocking_pids($2))
   AND NOT EXISTS (SELECT FROM pg_locks AS k WHERE k.pid = a.pid AND NOT k.granted AND ` + fenceLock + `)
 ORDER BY a.pid`

	// sqlFenceHolders describes the backends other than $2 that hold the
	// fence lock of lease $1: the holders a force-release waits for, still
	// visible after its wait timed out.
	sqlFenceHolders = sqlBackends + ` WHERE a.pid <> $2
   AND a.pid IN (SELECT k.pid FROM pg_locks AS k WHERE ` + fenceLockHeld + `)
 ORDER BY a.pid`

	// sqlFencePrepared describes the prepared transactions that hold the
	// fence lock of lease $1 in this database. A prepared transaction's
	// locks have no pid; they share a virtual transaction with its
	// transaction id's lock, which pg_prepared_xacts names.
	sqlFencePrepared = `SELECT p.gid, p.owner, p.prepared
  FROM pg_prepared_xacts AS p
 WHERE p.database = current_database()
   AND EXISTS (SELECT FROM pg_locks AS x JOIN pg_locks AS k ON k.virtualtransaction = x.virtualtransaction
                WHERE x.locktype = 'transactionid' AND x.transactionid = p.transaction AND x.pid IS NULL
                  AND k.pid IS NULL AND ` + fenceLockHeld + `)
 ORDER BY p.prepared, p.gid`

	// fenceLock matches the pg_locks rows k of the fence lock of lease $1
	// in this database, held or awaited (see pgfence.token_fence; keyed by
	// hashtext(lease) from migration 9); fenceLockHeld, those held.
	fenceLock = `k.locktype = 'advisory'
                  AND k.classid = 1885824614 AND k.objid = pg_catalog.hashtext($1)::oid AND k.objsubid = 2
                  AND k.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())`
	fenceLockHeld = fenceLock + ` AND k.granted`

	// sqlGet reads a lease's live grant, with the time to its expiry.
	sqlGet = `SELECT name, owner, fence, acquired_at, renewed_at, expires_at, metadata,
       (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint
  FROM pgfence.leases
 WHERE name = $1 AND expires_at > clock_timestamp()`

	// sqlList reads every live grant.
	sqlList = `SELECT name, owner, fence, acquired_at, renewed_at, expires_at, metadata
  FROM pgfence.leases
 WHERE expires_at > clock_timestamp()
 ORDER BY name`

	// sqlListen subscribes the listener connection.
	sqlListen = `LISTEN ` + notifyChannel

	// sqlProbe sends the listener's probe notification ($1 channel, $2
	// payload).
	sqlProbe = `SELECT pg_notify($1, $2)`

	// sqlUnlisten ends the subscription on a listener connection given up
	// on.
	sqlUnlisten = `UNLISTEN *`

	// sqlWantTry and sqlUnwant take and drop, on the interest connection,
	// the wait keys of names this client waits for or observes: the
	// advisory lock (1885824613 = 'pgfe', waitKey(name)) that
	// pgfence.notify_waiters tests before it notifies. $1 is an int4[] of
	// waitKey values. Keys are tried, never waited for (interest.go):
	// sqlWantTry returns those another session holds exclusively.
	sqlWantTry = `SELECT k FROM unnest($1::int4[]) AS k WHERE NOT pg_try_advisory_lock_shared(1885824613, k)`
	sqlUnwant  = `SELECT count(pg_advisory_unlock_shared(1885824613, k)) FROM unnest($1::int4[]) AS k`

	// sqlReleaseAtLeast ends one grant no sooner than its acquired_at + $4
	// µs (HoldAtLeast); committed like sqlRelease.
	sqlReleaseAtLeast = `SELECT pgfence.release_at_least($1, $2, $3, $4), set_config('synchronous_commit', 'off', true)`

	// sqlReleaseAtLeastDurable is sqlReleaseAtLeast committing as
	// configured.
	sqlReleaseAtLeastDurable = `SELECT pgfence.release_at_least($1, $2, $3, $4), ''`

	// sqlGrantSlot: one attempt at a slot of semaphore $1 with $2 slots
	// (migration 6). As sqlGrant, plus the slot's number and lease name;
	// lease NULL (not granted): no slot was free to take; ask again soon.
	sqlGrantSlot = `SELECT granted, slot, lease, holder, fence, acquired_at, renewed_at, expires_at, remaining_us
  FROM pgfence.try_acquire_slot($1, $2, $3, $4)`

	// sqlSlots reads the live grants of semaphore $1's slots 1..$2.
	sqlSlots = `SELECT l.name, l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at
  FROM generate_series(1, $2::int) AS s(k)
  JOIN pgfence.leases AS l ON l.name = $1 || '#' || s.k
 WHERE l.expires_at > clock_timestamp()
 ORDER BY s.k`

	// sqlOnceDone reads the record of period $2 of job $1, if any.
	sqlOnceDone = `SELECT fence, done_at FROM pgfence.once WHERE name = $1 AND period = $2`

	// sqlMarkDone records period $2 of lease $1 as done, in the caller's
	// fenced transaction: true recorded, false recorded before.
	sqlMarkDone = `SELECT pgfence.mark_done($1, $2)`
)
