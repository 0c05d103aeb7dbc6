-- Reverts 000017_prune.up.sql: grant_roles as migration 13 left it,
-- try_acquire_slot as migration 9 wrote it, and no pgfence.prune. Rows it
-- deleted stay deleted; the fence floor it raised stays raised, which
-- keeps every later fence above theirs.
BEGIN;

DROP FUNCTION pgfence.grant_roles();
ALTER FUNCTION pgfence.grant_roles_13() RENAME TO grant_roles;
DROP FUNCTION pgfence.prune(bigint, integer);

-- try_acquire_slot as migration 9 wrote it.
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
                greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, min_fence),
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


COMMIT;
