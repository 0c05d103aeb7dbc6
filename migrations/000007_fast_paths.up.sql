-- pgfence fast paths, version 7: the same grants, fences and checks as
-- migrations 4 to 6, at the cost of the SQL a user would write by hand.
-- Profiled with perf on the server (docs/performance.md has the figures):
--
-- 1. lock_key and wait_key become STABLE, so that PostgreSQL inlines them
--    into the statements that call them. Declared IMMUTABLE, their body's
--    convert_to (STABLE: it depends on the database encoding, which never
--    changes within a database) kept them from being inlined, and a SQL
--    function that is not inlined is parsed and planned again on every
--    call: that was a sixth of a grant, and of every fenced row write.
--    Neither is used in an index, which alone would need IMMUTABLE.
--
-- 2. try_acquire takes a lease that is free in one UPDATE. It first tries
--    the lease's fence lock (see token_fence): when nobody holds it, no
--    holder of the lease has a fenced transaction open, and an expired or
--    released grant is taken over at once. A live grant fails the UPDATE's
--    WHERE on the statement's snapshot and is not locked. When the fence
--    lock is held, or the lease has never been granted, the path of
--    migration 5 runs unchanged: look, then wait for the fence lock, then
--    upsert. The three-argument try_acquire becomes the four-argument one
--    without data.
BEGIN;

CREATE OR REPLACE FUNCTION pgfence.lock_key(name text) RETURNS bigint
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN ('x' || encode(substring(sha256(convert_to(name, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint;

CREATE OR REPLACE FUNCTION pgfence.wait_key(lease text) RETURNS integer
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN (pgfence.lock_key(lease) >> 32)::integer;

CREATE OR REPLACE FUNCTION pgfence.try_acquire(lease text, lease_owner text, ttl_us bigint, data text,
        OUT granted boolean, OUT holder text, OUT fence bigint, OUT acquired_at timestamptz,
        OUT renewed_at timestamptz, OUT expires_at timestamptz, OUT remaining_us bigint,
        OUT holder_data jsonb)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    doc jsonb := CASE WHEN data IS NOT NULL THEN pgfence.check_data(data) END; -- no call without data
BEGIN
    IF ttl_us IS NULL OR ttl_us < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: ttl must be positive, got %s microseconds', coalesce(ttl_us::text, 'NULL'));
    END IF;
    -- The fast path (see the top of this file).
    IF pg_try_advisory_xact_lock(1885824614, pgfence.wait_key(lease)) THEN
        RETURN QUERY
        UPDATE pgfence.leases AS l
           SET owner       = lease_owner,
               fence       = greatest(l.fence + 1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                                      (SELECT f.floor + 1 FROM pgfence.fence_floor AS f)),
               acquired_at = clock_timestamp(),
               renewed_at  = clock_timestamp(),
               expires_at  = clock_timestamp() + ttl_us * interval '1 microsecond',
               metadata    = doc
         WHERE l.name = lease AND l.expires_at <= clock_timestamp()
        RETURNING true, l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at, ttl_us, l.metadata;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- Held, never granted, or its former holder's fenced transaction is
    -- still open: migration 5's path. A live grant is answered from the
    -- snapshot without locking anything.
    RETURN QUERY
    SELECT false, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint, c.metadata
      FROM pgfence.leases AS c
     WHERE c.name = lease AND c.expires_at > clock_timestamp();
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1885824614, pgfence.wait_key(lease)); -- the fence lock: see token_fence
    RETURN QUERY
    INSERT INTO pgfence.leases AS l (name, owner, fence, acquired_at, renewed_at, expires_at, metadata)
    VALUES (lease, lease_owner,
            greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint,
                     (SELECT f.floor + 1 FROM pgfence.fence_floor AS f)),
            clock_timestamp(), clock_timestamp(), clock_timestamp() + ttl_us * interval '1 microsecond', doc)
    ON CONFLICT (name) DO UPDATE
       SET owner       = EXCLUDED.owner,
           fence       = greatest(l.fence + 1, EXCLUDED.fence),
           acquired_at = EXCLUDED.acquired_at,
           renewed_at  = EXCLUDED.renewed_at,
           expires_at  = EXCLUDED.expires_at,
           metadata    = EXCLUDED.metadata
     WHERE l.expires_at <= clock_timestamp()
    RETURNING true, l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at, ttl_us, l.metadata;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Taken meanwhile (the upsert re-checked the newest version): report
    -- that holder from a new snapshot.
    RETURN QUERY
    SELECT false, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint, c.metadata
      FROM pgfence.leases AS c
     WHERE c.name = lease AND c.expires_at > clock_timestamp();
END
$$;

CREATE OR REPLACE FUNCTION pgfence.try_acquire(lease text, lease_owner text, ttl_us bigint,
        OUT granted boolean, OUT holder text, OUT fence bigint, OUT acquired_at timestamptz,
        OUT renewed_at timestamptz, OUT expires_at timestamptz, OUT remaining_us bigint)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT t.granted, t.holder, t.fence, t.acquired_at, t.renewed_at, t.expires_at, t.remaining_us
      FROM pgfence.try_acquire(lease, lease_owner, ttl_us, NULL) AS t;
END
$$;

COMMIT;
