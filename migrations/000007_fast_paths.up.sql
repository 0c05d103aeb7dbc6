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
--    without data. release writes notify_waiters out in its body (one
--    PL/pgSQL call and one search_path switch fewer per release).
--
-- 3. The CHECK constraints of pgfence.leases go: PostgreSQL parses and
--    prepares every CHECK expression of a table again for each statement
--    that writes it, a tenth of a grant's cost, for rows only pgfence's
--    functions write (migration 4). The grant functions check the name
--    and owner lengths themselves, before writing (SQLSTATE 22023); a fence
--    is positive by construction (greatest of the clock and the floor).
BEGIN;

-- Dropping the constraints takes pgfence.leases exclusively. A fenced transaction that is
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
                    HINT    = 'end the long fenced transactions (pg_stat_activity), then run: migrate force 6 and migrate again';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.5);
        END;
    END LOOP;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END
$$;

ALTER TABLE pgfence.leases
    DROP CONSTRAINT leases_name_length,
    DROP CONSTRAINT leases_owner_length,
    DROP CONSTRAINT leases_fence_positive;

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
    IF lease IS NULL OR octet_length(lease) NOT BETWEEN 1 AND 200 OR lease_owner IS NULL OR octet_length(lease_owner) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'pgfence: a lease name and an owner must be 1 to 200 bytes';
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
           AND pg_try_advisory_xact_lock(1885824614, pgfence.wait_key(l.name))
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

-- release, as migration 4's, with notify_waiters (migration 6's) written
-- out in it: a nested PL/pgSQL call with its own search_path switch was a
-- tenth of a release when many clients release at once.
CREATE OR REPLACE FUNCTION pgfence.release(lease text, lease_owner text, lease_fence bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now  timestamptz := clock_timestamp();
    live boolean;
    sem  text;
BEGIN
    UPDATE pgfence.leases AS l
       SET expires_at = least(l.expires_at, now)
     WHERE l.name = lease AND l.owner = lease_owner AND l.fence = lease_fence
    RETURNING l.expires_at = now INTO live;
    IF live THEN
        -- notify_waiters: see there.
        IF NOT pg_try_advisory_xact_lock(1885824613, pgfence.wait_key(lease)) THEN
            PERFORM pg_notify('pgfence_leases', lease);
        END IF;
        IF strpos(lease, '#') > 0 THEN
            sem := substring(lease FROM '^(.+)#[1-9][0-9]*$');
            IF sem IS NOT NULL AND NOT pg_try_advisory_xact_lock(1885824613, pgfence.wait_key(sem)) THEN
                PERFORM pg_notify('pgfence_leases', sem);
            END IF;
        END IF;
    END IF;
    RETURN live;
END
$$;

COMMIT;
