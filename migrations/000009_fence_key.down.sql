-- Reverts 000009_fence_key.up.sql: the fence lock keyed by wait_key again,
-- and the functions as migrations 4, 7 and 8 left them, verbatim.
BEGIN;

-- A fenced transaction holds the fence lock under the new key until it
-- ends, and has read pgfence.leases. So the functions change only once no
-- such transaction is open, and none starts before they have: this takes
-- pgfence.leases exclusively. Each attempt queues for at most 100 ms --
-- grants, renewals and fenced writes wait behind it that long at most, so
-- no lease runs out meanwhile -- and attempts go on for 10 minutes, time
-- for a long fenced transaction (OnceTx's, say) to end.
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
                    HINT    = 'end the long fenced transactions (pg_stat_activity), then run: migrate force 9 and migrate again';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.5);
        END;
    END LOOP;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END
$$;

CREATE OR REPLACE FUNCTION pgfence.token_fence(tbl regclass) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    decl    text := current_setting('pgfence.token', true);
    xid     text;
    digits  text;
    lease   text;
    tok     bigint;
    current bigint;
BEGIN
    IF decl IS NULL OR decl = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: write to %s declares no fencing token', tbl),
            HINT    = 'write through fencing.Begin or fencing.InTx, or SELECT pgfence.declare_token(lease, fence) in the same transaction first';
    END IF;
    -- "xid:fence:lease", as declare_token writes it. Parsed with string
    -- functions: a regular expression costs more than the rest of the
    -- guard together.
    xid    := split_part(decl, ':', 1);
    digits := split_part(decl, ':', 2);
    lease  := substr(decl, length(xid) + length(digits) + 3);
    IF xid <> pg_current_xact_id()::text OR lease = ''
       OR length(digits) NOT BETWEEN 1 AND 19 OR left(digits, 1) = '0' OR translate(digits, '0123456789', '') <> '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: write to %s declares no fencing token for this transaction', tbl),
            HINT    = 'a token is declared per transaction with pgfence.declare_token; a session-level or earlier declaration is not honoured';
    END IF;
    tok := digits::bigint;
    PERFORM pg_advisory_xact_lock_shared(1885824614, pgfence.wait_key(lease));
    IF current_setting('transaction_isolation') = 'read committed' THEN
        SELECT l.fence INTO current
          FROM pgfence.leases AS l
         WHERE l.name = lease
           AND l.expires_at > clock_timestamp();
    ELSE
        SELECT l.fence INTO current
          FROM pgfence.leases AS l
         WHERE l.name = lease
           AND l.expires_at > clock_timestamp()
           FOR SHARE;
    END IF;
    IF current IS DISTINCT FROM tok THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF001',
            MESSAGE = format('pgfence: stale fencing token: lease %L fence %s is not the current unexpired grant (current %s)',
                             lease, tok, coalesce(current::text, 'none'));
    END IF;
    RETURN tok;
END
$$;

CREATE OR REPLACE FUNCTION pgfence.force_release(lease text, timeout_ms integer DEFAULT 5000)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now  timestamptz := clock_timestamp();
    live boolean;
    prev text := current_setting('lock_timeout');
BEGIN
    IF timeout_ms IS NULL OR timeout_ms < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: force-release timeout must be positive, got %s ms', coalesce(timeout_ms::text, 'NULL'));
    END IF;
    PERFORM set_config('lock_timeout', timeout_ms::text, true);
    PERFORM pg_advisory_xact_lock(1885824614, pgfence.wait_key(lease));
    UPDATE pgfence.leases AS l
       SET expires_at = least(l.expires_at, now)
     WHERE l.name = lease
    RETURNING l.expires_at = now INTO live;
    PERFORM set_config('lock_timeout', prev, true);
    IF FOUND THEN
        PERFORM pg_notify('pgfence_leases', lease);
    END IF;
    RETURN live;
END
$$;

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

CREATE OR REPLACE FUNCTION pgfence.fence_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    col     text := TG_ARGV[0];
    decl    text;
    xid     text;
    digits  text;
    lease   text;
    tok     bigint;
    current bigint;
    stored  bigint;
    locked  text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        tok := pgfence.token_fence(TG_RELID);
    ELSE
        decl := current_setting('pgfence.token', true);
        IF decl IS NULL OR decl = '' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF002',
                MESSAGE = format('pgfence: write to %s declares no fencing token', TG_RELID::regclass),
                HINT    = 'write through fencing.Begin or fencing.InTx, or SELECT pgfence.declare_token(lease, fence) in the same transaction first';
        END IF;
        xid    := split_part(decl, ':', 1);
        digits := split_part(decl, ':', 2);
        lease  := substr(decl, length(xid) + length(digits) + 3);
        IF xid <> pg_current_xact_id()::text OR lease = ''
           OR length(digits) NOT BETWEEN 1 AND 19 OR left(digits, 1) = '0' OR translate(digits, '0123456789', '') <> '' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF002',
                MESSAGE = format('pgfence: write to %s declares no fencing token for this transaction', TG_RELID::regclass),
                HINT    = 'a token is declared per transaction with pgfence.declare_token; a session-level or earlier declaration is not honoured';
        END IF;
        tok := digits::bigint;
        -- The fence lock (see token_fence), assigned rather than PERFORMed
        -- for the reason declare_token gives.
        locked := pg_advisory_xact_lock_shared(1885824614, pgfence.wait_key(lease))::text;
        SELECT l.fence INTO current
          FROM pgfence.leases AS l
         WHERE l.name = lease
           AND l.expires_at > clock_timestamp();
        IF current IS DISTINCT FROM tok THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF001',
                MESSAGE = format('pgfence: stale fencing token: lease %L fence %s is not the current unexpired grant (current %s)',
                                 lease, tok, coalesce(current::text, 'none'));
        END IF;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF col = 'fence' THEN
            stored := OLD.fence;
        ELSE
            stored := (to_jsonb(OLD) ->> col)::bigint;
        END IF;
        IF tok < stored THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF001',
                MESSAGE = format('pgfence: stale fencing token: fence %s is lower than the fence %s stored in %I.%I',
                                 tok, stored, TG_TABLE_SCHEMA, TG_TABLE_NAME),
                TABLE   = TG_TABLE_NAME,
                SCHEMA  = TG_TABLE_SCHEMA;
        END IF;
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    ELSIF col = 'fence' THEN
        NEW.fence := tok;
    ELSE
        NEW := jsonb_populate_record(NEW, jsonb_build_object(col, tok));
    END IF;
    RETURN NEW;
END
$$;

COMMIT;
