-- Reverts 000019_takeover_lock_timeout.up.sql: try_acquire as migration 9
-- wrote it.
BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

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
    IF lease IS NULL OR octet_length(lease) NOT BETWEEN 1 AND 200 OR lease_owner IS NULL OR octet_length(lease_owner) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgfence: a lease name and an owner must be 1 to 200 bytes';
    END IF;
    -- The fast path (see the top of this file).
    IF pg_try_advisory_xact_lock(1885824614, pg_catalog.hashtext(lease)) THEN
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
    PERFORM pg_advisory_xact_lock(1885824614, pg_catalog.hashtext(lease)); -- the fence lock: see token_fence
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

COMMIT;
