-- pgfence lease features, version 5: data with a lease, a keepalive that
-- learns of hand-over requests, and the hand-over request itself. Like
-- every write path since migration 4, each is a SECURITY DEFINER function
-- with a pinned search_path; applications never write pgfence.leases.
BEGIN;

-- The new column takes pgfence.leases exclusively. A fenced transaction that is
-- open holds a lock on it until it ends, and every grant, renewal and fenced
-- write would queue behind an ALTER that waits for that transaction: so,
-- as in migration 9, each attempt queues for at most 100 ms, and attempts
-- go on for 10 minutes.
DO $$
DECLARE
    prev     text := pg_catalog.current_setting('lock_timeout');
    deadline timestamptz := pg_catalog.clock_timestamp() + interval '10 minutes';
BEGIN
    LOOP
        BEGIN
            PERFORM pg_catalog.set_config('lock_timeout', '100ms', true);
            LOCK TABLE pgfence.leases IN ACCESS EXCLUSIVE MODE;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            IF pg_catalog.clock_timestamp() > deadline THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'lock_not_available',
                    MESSAGE = 'pgfence: transactions that read pgfence.leases stayed open for 10 minutes; nothing was changed',
                    HINT    = 'end the long fenced transactions (pg_stat_activity), then run: migrate force 4 and migrate again';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.5);
        END;
    END LOOP;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END
$$;

-- handover_fence is the fence of the grant an operator asked to step down
-- (pgfence.request_handover). Keyed by fence, not a flag: a later grant of
-- the name has another fence and so is never asked by an old request, and
-- no grant path needs to clear it. Not indexed, so that renewals and
-- releases stay HOT.
ALTER TABLE pgfence.leases ADD COLUMN handover_fence bigint;

COMMENT ON COLUMN pgfence.leases.handover_fence IS 'pgfence: the fence of the grant asked to hand the lease over (pgfence.request_handover); a request for an earlier grant if it differs from fence';
COMMENT ON COLUMN pgfence.leases.metadata IS 'pgfence: the data the current grant published (at most 1024 bytes of JSON text); NULL for none';

-- check_data validates a grant's data: JSON text of at most 1024 bytes, or
-- NULL. It raises 22023 (invalid_parameter_value) for oversize data and
-- 22P02 for text that is not JSON, before anything is written.
CREATE FUNCTION pgfence.check_data(data text) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF octet_length(data) > 1024 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: lease data must be at most 1024 bytes of JSON, got %s bytes', octet_length(data));
    END IF;
    RETURN data::jsonb;
END
$$;

-- try_acquire, with data: as the three-argument try_acquire of migration 4,
-- and the new grant's metadata is data (NULL: none). The result also
-- carries the data of the grant it describes -- the new one, or else the
-- holder's (a leader's published address, say).
CREATE FUNCTION pgfence.try_acquire(lease text, lease_owner text, ttl_us bigint, data text,
        OUT granted boolean, OUT holder text, OUT fence bigint, OUT acquired_at timestamptz,
        OUT renewed_at timestamptz, OUT expires_at timestamptz, OUT remaining_us bigint,
        OUT holder_data jsonb)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    min_fence bigint;
    doc       jsonb := CASE WHEN data IS NOT NULL THEN pgfence.check_data(data) END; -- no call without data
BEGIN
    IF ttl_us IS NULL OR ttl_us < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: ttl must be positive, got %s microseconds', coalesce(ttl_us::text, 'NULL'));
    END IF;
    RETURN QUERY
    SELECT false, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint, c.metadata
      FROM pgfence.leases AS c
     WHERE c.name = lease AND c.expires_at > clock_timestamp();
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT f.floor + 1 INTO min_fence FROM pgfence.fence_floor AS f;
    PERFORM pg_advisory_xact_lock(1885824614, pgfence.wait_key(lease)); -- the fence lock: see token_fence
    RETURN QUERY
    INSERT INTO pgfence.leases AS l (name, owner, fence, acquired_at, renewed_at, expires_at, metadata)
    VALUES (lease, lease_owner,
            greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, min_fence),
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
    RETURN QUERY
    SELECT false, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint, c.metadata
      FROM pgfence.leases AS c
     WHERE c.name = lease AND c.expires_at > clock_timestamp();
END
$$;

-- set_data replaces the data of one live grant -- exactly (lease, owner,
-- fence) -- waiting for row locks, and tells the lease's waiters and
-- observers, if any. true: replaced; NULL: the grant is no longer live
-- (expired, released, force-released or taken over) and nothing was
-- written. Oversize data raises 22023 and writes nothing.
CREATE FUNCTION pgfence.set_data(lease text, lease_owner text, lease_fence bigint, data text)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    doc jsonb := pgfence.check_data(data);
    ok  boolean;
BEGIN
    UPDATE pgfence.leases AS l
       SET metadata = doc
     WHERE l.name = lease AND l.owner = lease_owner AND l.fence = lease_fence
       AND l.expires_at > clock_timestamp()
    RETURNING true INTO ok;
    IF ok THEN
        PERFORM pgfence.notify_waiters(lease);
    END IF;
    RETURN ok;
END
$$;

-- renew_batch is renew_many of migration 4 that also says, per renewed
-- grant, whether an operator asked it to hand the lease over.
CREATE FUNCTION pgfence.renew_batch(leases text[], owners text[], fences bigint[], ttls_us bigint[])
    RETURNS TABLE (lease text, expires_at timestamptz, busy boolean, handover boolean)
    LANGUAGE sql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH v AS (
        SELECT * FROM unnest(leases, owners, fences, ttls_us) AS v(name, owner, fence, ttl_us)
    ), locked AS (
        SELECT l.name, v.ttl_us
          FROM pgfence.leases AS l
          JOIN v ON l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
         WHERE l.expires_at > clock_timestamp() AND v.ttl_us > 0
           FOR UPDATE OF l SKIP LOCKED
    ), renewed AS (
        UPDATE pgfence.leases AS l
           SET renewed_at = clock_timestamp(),
               expires_at = clock_timestamp() + k.ttl_us * interval '1 microsecond'
          FROM locked AS k
         WHERE l.name = k.name
        RETURNING l.name, l.expires_at, l.handover_fence IS NOT DISTINCT FROM l.fence AS handover
    )
    SELECT v.name, r.expires_at,
           r.name IS NULL AND EXISTS (
               SELECT FROM pgfence.leases AS l
                WHERE l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
                  AND l.expires_at > clock_timestamp()),
           coalesce(r.handover, false)
      FROM v LEFT JOIN renewed AS r ON r.name = v.name;
END;

-- request_handover asks the current grant of lease to step down: it
-- records the grant's fence in handover_fence and notifies, so that the
-- holder's client, if it listens, renews at once and learns of the request;
-- otherwise its next renewal (within a third of its TTL) does. The holder
-- ends its work and releases, and a waiter takes over. Nothing is forced:
-- a holder that does not step down keeps the lease (force_release is the
-- break-glass). Returns the grant asked, or no row if nobody holds lease.
CREATE FUNCTION pgfence.request_handover(lease text, OUT holder text, OUT fence bigint)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    UPDATE pgfence.leases AS l
       SET handover_fence = l.fence
     WHERE l.name = lease AND l.expires_at > clock_timestamp()
    RETURNING l.owner, l.fence;
    IF FOUND THEN
        PERFORM pg_notify('pgfence_leases', lease);
    END IF;
END
$$;

REVOKE ALL ON FUNCTION
    pgfence.check_data(text),
    pgfence.try_acquire(text, text, bigint, text),
    pgfence.set_data(text, text, bigint, text),
    pgfence.renew_batch(text[], text[], bigint[], bigint[]),
    pgfence.request_handover(text)
    FROM PUBLIC;

-- The roles of migration 4, where they exist (see pgfence.grant_roles).
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgfence_client')
       AND EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgfence_operator') THEN
        GRANT EXECUTE ON FUNCTION
            pgfence.try_acquire(text, text, bigint, text),
            pgfence.set_data(text, text, bigint, text),
            pgfence.renew_batch(text[], text[], bigint[], bigint[])
            TO pgfence_client;
        GRANT EXECUTE ON FUNCTION pgfence.request_handover(text) TO pgfence_operator;
    ELSE
        RAISE NOTICE 'pgfence: roles pgfence_client and pgfence_operator do not exist; the functions of migration 5 were granted to nobody';
    END IF;
END
$$;

COMMIT;
