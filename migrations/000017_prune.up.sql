-- pgfence prune, version 17: pgfence.prune deletes lease rows expired
-- long ago.
--
-- Rows used never to be deleted, so that the next grant of a name always
-- had the previous fence to exceed (docs/design.md, "Fences"); a service
-- that names its leases after entities (a lease per invoice, per tenant)
-- grew the table without bound. prune deletes the rows whose grant
-- expired before clock_timestamp() - older_than_us microseconds and, in
-- the same transaction, raises pgfence.fence_floor to the highest fence it
-- deleted: every later grant's fence is at least floor + 1, so a deleted
-- name's next grant still gets a higher fence than any it had, and any
-- fence stored in a protected row by it is still exceeded.
--
-- A row is left for a later call when its fence lock is held (a fenced
-- transaction of its last holder is still open) or when another
-- transaction has locked it (a grant taking it now). The fence
-- lock is tried only on rows already found expired: CASE fixes the order,
-- which the planner may change between AND-ed conditions, and a held
-- fence lock of a live lease would stall its holder's fenced writes until
-- this transaction ends. At most max_rows rows per call, so that one
-- call's transaction and its locks stay short; it returns how many rows
-- it deleted. Operators only (pgfence_operator).
BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

CREATE FUNCTION pgfence.prune(older_than_us bigint, max_rows integer DEFAULT 10000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff  timestamptz;
    n       bigint;
    highest bigint;
BEGIN
    IF older_than_us IS NULL OR older_than_us < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: prune: older_than must be 0 or more microseconds, got %s', coalesce(older_than_us::text, 'NULL'));
    END IF;
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: prune: max_rows must be positive, got %s', coalesce(max_rows::text, 'NULL'));
    END IF;
    cutoff := clock_timestamp() - older_than_us * interval '1 microsecond';
    WITH doomed AS (
        SELECT l.name
          FROM pgfence.leases AS l
         WHERE CASE WHEN l.expires_at < cutoff
                    THEN pg_try_advisory_xact_lock(1885824614, pg_catalog.hashtext(l.name))
                    ELSE false END
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgfence.leases AS l
         USING doomed AS d
         WHERE l.name = d.name
        RETURNING l.fence
    )
    SELECT count(*), max(g.fence) INTO n, highest FROM gone AS g;
    IF highest IS NOT NULL THEN
        UPDATE pgfence.fence_floor AS f SET floor = highest WHERE f.floor < highest;
    END IF;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION pgfence.prune(bigint, integer) FROM PUBLIC;

-- try_acquire_slot as migration 9 wrote it, but for one thing: a slot
-- never granted (or pruned) is inserted with the fence floor read by the
-- INSERT itself, not at the function's start. A prune that committed in
-- between had raised the floor above the deleted slot's fence, and the
-- row's new fence had to exceed it; read before, it could be below the
-- deleted one (when that was above the clock, after a fence bump).
-- try_acquire reads the floor in its INSERT already, after the fence lock.
CREATE OR REPLACE FUNCTION pgfence.try_acquire_slot(sem text, slots integer, lease_owner text, ttl_us bigint,
        OUT granted boolean, OUT slot integer, OUT lease text, OUT holder text, OUT fence bigint,
        OUT acquired_at timestamptz, OUT renewed_at timestamptz, OUT expires_at timestamptz, OUT remaining_us bigint)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    min_fence bigint;
    k         integer;
BEGIN
    IF ttl_us IS NULL OR ttl_us < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: ttl must be positive, got %s microseconds', coalesce(ttl_us::text, 'NULL'));
    END IF;
    IF slots IS NULL OR slots NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: a semaphore has 1 to 1000 slots, got %s', coalesce(slots::text, 'NULL'));
    END IF;
    IF sem IS NULL OR octet_length(sem || '#' || slots) > 200 OR lease_owner IS NULL OR octet_length(lease_owner) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgfence: a slot''s lease name (semaphore name, ''#'', slot number) and the owner must be 1 to 200 bytes';
    END IF;
    SELECT f.floor + 1 INTO min_fence FROM pgfence.fence_floor AS f;
    -- An expired slot. SKIP LOCKED: a row locked by another taker is
    -- passed over, not waited for; a row re-granted meanwhile fails the
    -- re-check and the next one is tried. The slot's fence lock (see
    -- pgfence.token_fence) is tried, not waited for: a slot whose former
    -- holder still has a fenced transaction open is passed over, so that
    -- transaction commits before the slot is granted again.
    RETURN QUERY
    WITH free AS (
        SELECT l.name, s.k
          FROM generate_series(1, slots) AS s(k)
          JOIN pgfence.leases AS l ON l.name = sem || '#' || s.k
         WHERE l.expires_at <= clock_timestamp()
           AND pg_try_advisory_xact_lock(1885824614, pg_catalog.hashtext(l.name))
         ORDER BY s.k
         LIMIT 1
           FOR UPDATE OF l SKIP LOCKED
    )
    UPDATE pgfence.leases AS l
       SET owner       = lease_owner,
           fence       = greatest(l.fence + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, min_fence),
           acquired_at = clock_timestamp(),
           renewed_at  = clock_timestamp(),
           expires_at  = clock_timestamp() + ttl_us * interval '1 microsecond',
           metadata    = NULL
      FROM free
     WHERE l.name = free.name
    RETURNING true, free.k, l.name, l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at, ttl_us;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A slot never granted yet.
    FOR k IN
        SELECT s.k
          FROM generate_series(1, slots) AS s(k)
         WHERE NOT EXISTS (SELECT FROM pgfence.leases AS l WHERE l.name = sem || '#' || s.k)
         ORDER BY s.k
    LOOP
        RETURN QUERY
        INSERT INTO pgfence.leases AS l (name, owner, fence, acquired_at, renewed_at, expires_at)
        VALUES (sem || '#' || k, lease_owner,
                greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                         (SELECT f.floor + 1 FROM pgfence.fence_floor AS f)), -- read here, not at the start (migration 17)
                clock_timestamp(), clock_timestamp(), clock_timestamp() + ttl_us * interval '1 microsecond')
        ON CONFLICT (name) DO NOTHING
        RETURNING true, k, l.name, l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at, ttl_us;
        IF FOUND THEN
            RETURN;
        END IF;
    END LOOP;
    -- Full: the live slot that frees first.
    RETURN QUERY
    SELECT false, s.k, c.name, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint
      FROM generate_series(1, slots) AS s(k)
      JOIN pgfence.leases AS c ON c.name = sem || '#' || s.k
     WHERE c.expires_at > clock_timestamp()
     ORDER BY c.expires_at
     LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT false, NULL::integer, NULL::text, NULL::text, NULL::bigint,
                        NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, 0::bigint;
END
$$;


-- grant_roles grants it too, as migration 13's did for migration 12.
ALTER FUNCTION pgfence.grant_roles() RENAME TO grant_roles_13;

CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgfence.grant_roles_13();
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RETURN; -- grant_roles_4 said so
    END IF;
    GRANT EXECUTE ON FUNCTION pgfence.prune(bigint, integer) TO pgfence_operator;
END
$$;

REVOKE ALL ON FUNCTION pgfence.grant_roles() FROM PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
