-- pgfence once per period and semaphores, version 6. Like migration 4's
-- functions, every new write path is a SECURITY DEFINER function with a
-- pinned search_path, executable by pgfence_client only.
--
-- 1. Once per period. pgfence.once records that the work of one period of
--    a job (lease name x period key, e.g. 'billing/nightly' x '2026-12-01')
--    is done. mark_done writes the record inside the caller's fenced
--    transaction, after pgfence.token_fence has checked the transaction's
--    token: only the current, unexpired grant of the lease can record, and
--    its lease row stays share-locked until the transaction ends, so no
--    later grant commits before the record does. A crash before the commit
--    leaves no record (the next holder runs the period); a stalled former
--    holder's record is rejected (PF001); two records of one period are
--    impossible (primary key).
--
-- 2. Minimum hold. release_at_least ends a grant no sooner than
--    acquired_at + at_least by the database clock (ShedLock's
--    lockAtLeastFor): a fast job on a replica whose clock is behind cannot
--    take the lease again within the same tick.
--
-- 3. Semaphores. A semaphore name with N slots is N leases named
--    '<name>#1' .. '<name>#N': each grant of a slot has its own fence,
--    renewals and releases are the lease functions', and the guard checks a
--    slot's token (slot lease name, fence) unchanged. try_acquire_slot
--    grants the first free slot in one call. notify_waiters also wakes the
--    waiters of the semaphore when a slot is released.
BEGIN;

CREATE TABLE pgfence.once (
    name    text        NOT NULL,
    period  text        NOT NULL,
    fence   bigint      NOT NULL,
    done_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT once_pkey PRIMARY KEY (name, period),
    CONSTRAINT once_name_length CHECK (octet_length(name) BETWEEN 1 AND 200),
    CONSTRAINT once_period_length CHECK (octet_length(period) BETWEEN 1 AND 200),
    CONSTRAINT once_fence_positive CHECK (fence > 0)
);

COMMENT ON TABLE pgfence.once IS 'pgfence: periods of a job (lease name) that are done, written by pgfence.mark_done under the lease''s fence';

-- mark_done records that period of lease is done, in the current
-- transaction, which must have declared the token of the lease's current
-- grant (pgfence.declare_token; fencing.InTx does it). true: recorded;
-- false: the period was already recorded -- roll back whatever the
-- transaction did for it. A stale or missing token raises PF001 or PF002,
-- as the guard would.
CREATE FUNCTION pgfence.mark_done(lease text, period text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tok      bigint := pgfence.token_fence('pgfence.once'::regclass);
    decl     text   := current_setting('pgfence.token', true);
    declared text;
BEGIN
    -- "xid:fence:lease", checked by token_fence just now.
    declared := substr(decl, length(split_part(decl, ':', 1)) + length(split_part(decl, ':', 2)) + 3);
    IF declared IS DISTINCT FROM lease THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: mark_done of lease %L, but the transaction''s token is for lease %L', lease, declared),
            HINT    = 'declare the token of the lease whose period is done';
    END IF;
    INSERT INTO pgfence.once AS o (name, period, fence)
    VALUES (lease, period, tok)
    ON CONFLICT ON CONSTRAINT once_pkey DO NOTHING;
    RETURN FOUND;
END
$$;

-- release_at_least ends one grant -- exactly (lease, owner, fence) -- but
-- not before acquired_at + at_least_us (database clock): the grant stays
-- live until then, unrenewed. true: it was live (and is released now, or at
-- that time); false: it had already expired; NULL: no such grant. Waiters
-- are notified when the release takes effect at once; otherwise they wake
-- at the new expiry.
CREATE FUNCTION pgfence.release_at_least(lease text, lease_owner text, lease_fence bigint, at_least_us bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now   timestamptz := clock_timestamp();
    until timestamptz;
    since timestamptz;
BEGIN
    IF at_least_us IS NULL OR at_least_us < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: minimum hold must not be negative, got %s microseconds', coalesce(at_least_us::text, 'NULL'));
    END IF;
    SELECT l.expires_at, l.acquired_at INTO until, since
      FROM pgfence.leases AS l
     WHERE l.name = lease AND l.owner = lease_owner AND l.fence = lease_fence
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    ELSIF until <= now THEN
        RETURN false;
    END IF;
    until := greatest(now, since + at_least_us * interval '1 microsecond');
    UPDATE pgfence.leases AS l
       SET expires_at = until
     WHERE l.name = lease AND l.owner = lease_owner AND l.fence = lease_fence;
    IF until = now THEN
        PERFORM pgfence.notify_waiters(lease);
    END IF;
    RETURN true;
END
$$;

-- try_acquire_slot grants a slot of semaphore sem (slots '<sem>#1' ..
-- '<sem>#<slots>', each a lease) to owner for ttl_us microseconds: the
-- lowest-numbered slot that has no row, or whose grant has expired and
-- whose row nobody has locked. granted says whether one was; the other
-- columns describe the new grant or else, when every slot is held, the
-- grant that expires first, with remaining_us the time to its expiry. A
-- row with granted false and lease NULL: no slot is live but none was free
-- to take (an expired slot row is locked by its former holder's open
-- fenced transaction, or was taken meanwhile); ask again soon. All callers
-- of one semaphore must pass the same slots.
CREATE FUNCTION pgfence.try_acquire_slot(sem text, slots integer, lease_owner text, ttl_us bigint,
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

-- notify_waiters (migration 4's, extended): a release of a slot
-- '<sem>#<k>' also wakes the waiters of semaphore <sem>, who hold <sem>'s
-- wait key, so that one release wakes waiters of any slot. A lease whose
-- name merely looks like a slot costs a spurious wake-up at most.
CREATE OR REPLACE FUNCTION pgfence.notify_waiters(lease text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    sem text;
BEGIN
    -- The exclusive try fails exactly when a waiter holds the key shared;
    -- when it succeeds it holds the key until commit, so a waiter that
    -- arrives meanwhile registers after this release and then sees it.
    IF NOT pg_try_advisory_xact_lock(1885824613, pgfence.wait_key(lease)) THEN
        PERFORM pg_notify('pgfence_leases', lease);
    END IF;
    IF strpos(lease, '#') > 0 THEN
        sem := substring(lease FROM '^(.+)#[1-9][0-9]*$');
        IF sem IS NOT NULL AND NOT pg_try_advisory_xact_lock(1885824613, pgfence.wait_key(sem)) THEN
            PERFORM pg_notify('pgfence_leases', sem);
        END IF;
    END IF;
END
$$;

REVOKE ALL ON pgfence.once FROM PUBLIC;
REVOKE ALL ON FUNCTION
    pgfence.mark_done(text, text),
    pgfence.release_at_least(text, text, bigint, bigint),
    pgfence.try_acquire_slot(text, integer, text, bigint)
    FROM PUBLIC;

-- grant_roles gives the roles this migration's privileges after those of
-- the migrations before (renamed grant_roles_4, and called first), so that
-- calling pgfence.grant_roles() after creating the roles by hand still
-- grants everything.
ALTER FUNCTION pgfence.grant_roles() RENAME TO grant_roles_4;

CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgfence.grant_roles_4();
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RETURN; -- grant_roles_4 said so
    END IF;
    GRANT SELECT ON pgfence.once TO pgfence_client;
    GRANT EXECUTE ON FUNCTION
        pgfence.mark_done(text, text),
        pgfence.release_at_least(text, text, bigint, bigint),
        pgfence.try_acquire_slot(text, integer, text, bigint)
        TO pgfence_client;
END
$$;

REVOKE ALL ON FUNCTION pgfence.grant_roles() FROM PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
