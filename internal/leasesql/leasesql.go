// Package leasesql holds the SQL of package leases, in one place, so that
// the pgfence command's raw-SQL benchmark baseline sends exactly the
// statements the library sends and cannot drift from them.
package leasesql

// Every statement is parameterised, every time
// comes from the database clock (clock_timestamp()), and TTLs travel as
// bigint microseconds so that no client-side time arithmetic is involved.
// Renewal and release name the exact grant — (name, owner, fence) — so a
// stale holder can never touch a newer grant.

// NotifyChannel is the LISTEN/NOTIFY channel; the payload is the lease name.
const NotifyChannel = "pgfence_leases"

// Grant takes the lease if nobody holds it or the holder's grant has
// expired by the database clock, in one statement. The first row says
// whether it was granted and describes the grant, or else the holder
// (read from the statement's snapshot: when the holder committed after the
// snapshot there is no row at all, and the caller looks again).
// remaining_us is the time to the described grant's expiry, server clock.
//
// A grant that is live in the snapshot is answered from the snapshot
// without touching the row: INSERT … ON CONFLICT DO UPDATE locks the
// conflicting row before it evaluates its WHERE, and a holder inside a
// fenced transaction keeps a share lock on its lease row (fence_guard), so
// attempting the upsert on a live lease would wait for the holder's
// transaction instead of answering "held". Only a grant that is expired
// (or absent) in the snapshot is upserted — and then waiting for an
// in-flight fenced transaction is exactly right: it commits before the
// takeover or is rejected.
//
// Fences increase in grant order. A takeover draws its fence in DO UPDATE,
// after it has locked the row, so it is drawn after the previous grant of
// that name committed. Lease rows are never deleted (release and
// force-release set expires_at instead), so only a name's very first grant
// takes the INSERT path with the fence drawn in VALUES, before any lock: a
// concurrent first grant that loses the insert race waits for the winner's
// row and then takes the DO UPDATE path. (With deletes, an acquirer that
// drew fence n, then waited on another's insert of n+1, could insert n after
// that holder released: two grants out of fence order.)
//
// The fence comes from pgfence.next_fence() (migration 3): nextval of
// pgfence.fence_seq, first advanced by a large gap when the server's
// timeline has changed since the last draw, so fences keep increasing
// across a failover that lost the tail of the WAL; on a standby it fails
// (SQLSTATE 25006). It is evaluated only when the upsert is attempted;
// fences only need to increase, not to be dense.
const Grant = `
WITH cur AS (
    SELECT c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at
      FROM pgfence.leases AS c
     WHERE c.name = $1
), granted AS (
    INSERT INTO pgfence.leases AS l (name, owner, fence, acquired_at, renewed_at, expires_at)
    SELECT $1, $2, pgfence.next_fence(), clock_timestamp(), clock_timestamp(),
           clock_timestamp() + $3::bigint * interval '1 microsecond'
     WHERE NOT EXISTS (SELECT FROM cur WHERE cur.expires_at > clock_timestamp())
    ON CONFLICT (name) DO UPDATE
       SET owner       = EXCLUDED.owner,
           fence       = pgfence.next_fence(),
           acquired_at = clock_timestamp(),
           renewed_at  = clock_timestamp(),
           expires_at  = clock_timestamp() + $3::bigint * interval '1 microsecond',
           metadata    = NULL
     WHERE l.expires_at <= clock_timestamp()
    RETURNING l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at
)
SELECT true, g.owner, g.fence, g.acquired_at, g.renewed_at, g.expires_at,
       (extract(epoch FROM g.expires_at - clock_timestamp()) * 1000000)::bigint
  FROM granted AS g
UNION ALL
SELECT false, h.owner, h.fence, h.acquired_at, h.renewed_at, h.expires_at,
       (extract(epoch FROM h.expires_at - clock_timestamp()) * 1000000)::bigint
  FROM cur AS h
 WHERE NOT EXISTS (SELECT FROM granted)`

// RenewBatch renews many grants in one statement (the keepalive's tick).
// Rows locked by someone else — a fenced transaction of the holder holds a
// share lock on its lease row, a contending acquirer locks it briefly — are
// skipped rather than waited for, so one busy row cannot stall the renewal
// of every other lease; they come back with busy = true and are retried
// soon. A grant with expires_at NULL and busy false matched no live row: it
// is lost.
const RenewBatch = `
WITH v AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS v(name, owner, fence, ttl_us)
), locked AS (
    SELECT l.name, v.ttl_us
      FROM pgfence.leases AS l
      JOIN v ON l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
     WHERE l.expires_at > clock_timestamp()
       FOR UPDATE OF l SKIP LOCKED
), renewed AS (
    UPDATE pgfence.leases AS l
       SET renewed_at = clock_timestamp(),
           expires_at = clock_timestamp() + k.ttl_us * interval '1 microsecond'
      FROM locked AS k
     WHERE l.name = k.name
    RETURNING l.name, l.expires_at
)
SELECT v.name, r.expires_at,
       r.name IS NULL AND EXISTS (
           SELECT FROM pgfence.leases AS l
            WHERE l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
              AND l.expires_at > clock_timestamp())
  FROM v LEFT JOIN renewed AS r ON r.name = v.name`

// Renew renews one grant, waiting for row locks (Lease.Renew; the
// caller's context bounds it). No row: the grant is lost.
const Renew = `
UPDATE pgfence.leases
   SET renewed_at = clock_timestamp(),
       expires_at = clock_timestamp() + $4::bigint * interval '1 microsecond'
 WHERE name = $1 AND owner = $2 AND fence = $3 AND expires_at > clock_timestamp()
RETURNING expires_at`

// Release ends one grant now and notifies waiters in the same statement.
// The row stays (expired) so that the next grant of the name draws its
// fence under the row lock; see Grant. live is false when the grant had
// already expired.
const Release = `
WITH cur AS (
    SELECT c.name, c.expires_at > clock_timestamp() AS live
      FROM pgfence.leases AS c
     WHERE c.name = $1 AND c.owner = $2 AND c.fence = $3
), d AS (
    UPDATE pgfence.leases AS l
       SET expires_at = least(l.expires_at, clock_timestamp())
      FROM cur
     WHERE l.name = cur.name AND l.owner = $2 AND l.fence = $3
    RETURNING l.name, cur.live
)
SELECT pg_notify('` + NotifyChannel + `', d.name), d.live FROM d`

// ReleaseBatch ends many grants now and notifies for each (Close, and
// grants the client stopped trusting at their local deadline).
const ReleaseBatch = `
WITH d AS (
    UPDATE pgfence.leases AS l
       SET expires_at = least(l.expires_at, clock_timestamp())
      FROM unnest($1::text[], $2::text[], $3::bigint[]) AS v(name, owner, fence)
     WHERE l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
    RETURNING l.name
)
SELECT pg_notify('` + NotifyChannel + `', d.name) FROM d`

// ForceRelease expires whatever grant a lease has, now, and notifies.
// The holder's next renewal matches no live row; the next grant takes a new,
// higher fence.
const ForceRelease = `
WITH cur AS (
    SELECT c.name, c.expires_at > clock_timestamp() AS live
      FROM pgfence.leases AS c
     WHERE c.name = $1
), d AS (
    UPDATE pgfence.leases AS l
       SET expires_at = least(l.expires_at, clock_timestamp())
      FROM cur
     WHERE l.name = cur.name
    RETURNING l.name, cur.live
)
SELECT pg_notify('` + NotifyChannel + `', d.name), d.live FROM d`

// Get reads a lease's live grant, with the time to its expiry.
const Get = `
SELECT name, owner, fence, acquired_at, renewed_at, expires_at,
       (extract(epoch FROM expires_at - clock_timestamp()) * 1000000)::bigint
  FROM pgfence.leases
 WHERE name = $1 AND expires_at > clock_timestamp()`

// List reads every live grant.
const List = `
SELECT name, owner, fence, acquired_at, renewed_at, expires_at
  FROM pgfence.leases
 WHERE expires_at > clock_timestamp()
 ORDER BY name`

// Listen subscribes the listener connection.
const Listen = `LISTEN ` + NotifyChannel

// Probe sends the listener's probe notification ($1 channel, $2 payload).
const Probe = `SELECT pg_notify($1, $2)`

// Unlisten ends the subscription on a listener connection given up on.
const Unlisten = `UNLISTEN *`
