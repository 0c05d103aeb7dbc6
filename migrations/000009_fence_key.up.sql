-- pgfence fence lock and guard, version 9: the same checks as migration 8,
-- for a fifth less of the server work that fencing adds to a one-row
-- transaction, and less per grant (counted in instructions;
-- docs/performance.md has the figures).
--
-- 1. The fence lock (see token_fence) is keyed by hashtext(lease) instead
--    of wait_key(lease): (1885824614, hashtext(lease)). wait_key hashes
--    with sha256: an eighth of the guard's cost, 18 k instructions, paid
--    by every grant's fast path too. The fence lock is taken and awaited
--    only inside this server, by the functions below, so a key that
--    another server or a client could not compute is enough. The waiters' lock keeps wait_key (clients compute
--    it). Every function that takes the fence lock changes here, after
--    the lock below has waited out every transaction that may hold it
--    under the old key.
--
-- 2. fence_guard sets no search_path: every function, operator and type in
--    it is schema-qualified, so the writer's search_path cannot change
--    what it does (as declare_token, migration 8). It runs fewer
--    statements: each PL/pgSQL expression is prepared again in every
--    transaction.
BEGIN;

-- A fenced transaction holds the fence lock under the old key until it
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
                    HINT    = 'end the long fenced transactions (pg_stat_activity), then run: migrate force 8 and migrate again';
            END IF;
            PERFORM pg_catalog.pg_sleep(0.5);
        END;
    END LOOP;
    PERFORM pg_catalog.set_config('lock_timeout', prev, true);
END
$$;

-- token_fence, as before, with the fence lock keyed by hashtext.
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
    PERFORM pg_advisory_xact_lock_shared(1885824614, pg_catalog.hashtext(lease));
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

-- force_release, as before, with the fence lock keyed by hashtext.
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
    PERFORM pg_advisory_xact_lock(1885824614, pg_catalog.hashtext(lease));
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

-- try_acquire, as before, with the fence lock keyed by hashtext.
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

-- try_acquire_slot, as before, with the fence lock keyed by hashtext.
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

-- fence_guard, as migration 8's: under READ COMMITTED it checks the token
-- itself (token_fence's path written out), otherwise it calls token_fence.
CREATE OR REPLACE FUNCTION pgfence.fence_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    decl    pg_catalog.text;
    digits  pg_catalog.text;
    lease   pg_catalog.text;
    tok     bigint;
    current bigint;
    locked  pg_catalog.text;
    stored  bigint;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        tok := pgfence.token_fence(TG_RELID);
    ELSE
        -- "xid:fence:lease", as declare_token writes it.
        decl   := pg_catalog.current_setting('pgfence.token', true);
        digits := pg_catalog.split_part(decl, ':', 2);
        lease  := pg_catalog.substr(decl, pg_catalog.length(pg_catalog.split_part(decl, ':', 1))
                                          OPERATOR(pg_catalog.+) pg_catalog.length(digits) OPERATOR(pg_catalog.+) 3);
        IF decl IS NULL
           OR pg_catalog.split_part(decl, ':', 1) OPERATOR(pg_catalog.<>) pg_catalog.pg_current_xact_id()::pg_catalog.text
           OR lease OPERATOR(pg_catalog.=) ''
           OR pg_catalog.length(digits) OPERATOR(pg_catalog.<) 1 OR pg_catalog.length(digits) OPERATOR(pg_catalog.>) 19
           OR pg_catalog.left(digits, 1) OPERATOR(pg_catalog.=) '0'
           OR pg_catalog.translate(digits, '0123456789', '') OPERATOR(pg_catalog.<>) '' THEN
            IF decl IS NULL OR decl OPERATOR(pg_catalog.=) '' THEN
                RAISE EXCEPTION USING
                    ERRCODE = 'PF002',
                    MESSAGE = pg_catalog.format('pgfence: write to %I.%I declares no fencing token', TG_TABLE_SCHEMA, TG_TABLE_NAME),
                    HINT    = 'write through fencing.Begin or fencing.InTx, or SELECT pgfence.declare_token(lease, fence) in the same transaction first';
            END IF;
            RAISE EXCEPTION USING
                ERRCODE = 'PF002',
                MESSAGE = pg_catalog.format('pgfence: write to %I.%I declares no fencing token for this transaction', TG_TABLE_SCHEMA, TG_TABLE_NAME),
                HINT    = 'a token is declared per transaction with pgfence.declare_token; a session-level or earlier declaration is not honoured';
        END IF;
        tok := digits::bigint;
        -- The fence lock, before the read (see token_fence); assigned, not
        -- PERFORMed: PERFORM runs a query through the executor.
        locked := pg_catalog.pg_advisory_xact_lock_shared(1885824614, pg_catalog.hashtext(lease))::pg_catalog.text;
        SELECT l.fence INTO current
          FROM pgfence.leases AS l
         WHERE l.name OPERATOR(pg_catalog.=) lease
           AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();
        IF current IS NULL OR current OPERATOR(pg_catalog.<>) tok THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF001',
                MESSAGE = pg_catalog.format('pgfence: stale fencing token: lease %L fence %s is not the current unexpired grant (current %s)',
                                            lease, tok, COALESCE(current::pg_catalog.text, 'none'));
        END IF;
    END IF;
    -- The row's stored fence must not exceed the token's (OLD is NULL on
    -- INSERT). The usual column, "fence", is read and written directly, on
    -- the fewest statements; any other name goes through jsonb.
    IF TG_ARGV[0] OPERATOR(pg_catalog.=) 'fence' THEN
        IF tok OPERATOR(pg_catalog.<) OLD.fence THEN
            stored := OLD.fence; -- rejected below
        ELSIF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
            RETURN OLD;
        ELSE
            NEW.fence := tok;
            RETURN NEW;
        END IF;
    ELSIF TG_OP OPERATOR(pg_catalog.<>) 'INSERT' THEN
        stored := (pg_catalog.to_jsonb(OLD) OPERATOR(pg_catalog.->>) TG_ARGV[0])::bigint;
    END IF;
    IF tok OPERATOR(pg_catalog.<) stored THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF001',
            MESSAGE = pg_catalog.format('pgfence: stale fencing token: fence %s is lower than the fence %s stored in %I.%I',
                                        tok, stored, TG_TABLE_SCHEMA, TG_TABLE_NAME),
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;
    IF TG_OP OPERATOR(pg_catalog.=) 'DELETE' THEN
        RETURN OLD;
    END IF;
    NEW := pg_catalog.jsonb_populate_record(NEW, pg_catalog.jsonb_build_object(TG_ARGV[0], tok));
    RETURN NEW;
END
$$;

COMMIT;
