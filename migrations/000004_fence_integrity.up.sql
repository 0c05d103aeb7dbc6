-- pgfence fence integrity, version 4: fences that cannot be forged, reissued
-- or leaked, and least privilege by role. docs/design.md argues each rule;
-- the threat model there says what it promises against whom.
--
-- 1. Fences come from the database clock, per lease. A grant's fence is
--        greatest(previous fence of that lease + 1,
--                 microseconds since the Unix epoch by clock_timestamp(),
--                 pgfence.fence_floor + 1)
--    so it exceeds every earlier fence of the lease that survives in the
--    table, and -- because time moves on while an old history is lost and a
--    new one takes over -- every fence a lost history issued: a failover to
--    an asynchronous standby, two promotions that both reach timeline 2, a
--    dump restored over newer data, a PITR, a volume snapshot rolled back.
--    The one assumption is the server clock: a new primary's clock must not
--    be behind the old one's by more than the time from the last lost grant
--    to the first new one (a failover's detection time: seconds). When it
--    may be, `pgfence fence bump` (pgfence.bump_fence) raises the floor.
--    This replaces migration 3's sequence and epochs (timeline and system
--    identifier), which two promotions to the same timeline number and any
--    restore within one cluster defeated.
--
-- 2. Applications never write pgfence.leases: grants, renewals and releases
--    go through SECURITY DEFINER functions with a pinned search_path. Roles
--    pgfence_client (what an application needs) and pgfence_operator (that,
--    plus force-release, fence bump and the checks) carry the privileges.
--
-- 3. The guard honours a token only when it was declared for the current
--    transaction (pgfence.declare_token binds it to the transaction's id:
--    a session-level SET, or one left over from an earlier transaction on a
--    pooled connection, is not honoured) and only when it names a lease
--    whose current, unexpired grant has that fence -- so only fences that
--    were issued, and are still held, can write.
BEGIN;

-- Roles. They are cluster-wide, so a second database (or a concurrent
-- migration) may have created them already. A role that may not create
-- roles gets a NOTICE and no grants; see pgfence.grant_roles below.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgfence_client') THEN
        CREATE ROLE pgfence_client NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgfence_operator') THEN
        CREATE ROLE pgfence_operator NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL; -- created concurrently by a migration of another database
    WHEN insufficient_privilege THEN
        RAISE NOTICE USING
            MESSAGE = 'pgfence: this role may not create roles, so pgfence_client and pgfence_operator were not created',
            HINT    = 'as a role with CREATEROLE run: CREATE ROLE pgfence_client NOLOGIN; CREATE ROLE pgfence_operator NOLOGIN; then, as the role that migrated: SELECT pgfence.grant_roles();';
END
$$;

-- The floor every new fence exceeds: raised by bump_fence, and at first to
-- the highest fence of the sequence era so that no fence goes backwards.
CREATE TABLE pgfence.fence_floor (
    singleton boolean     PRIMARY KEY DEFAULT true,
    floor     bigint      NOT NULL,
    bumped_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT fence_floor_one_row CHECK (singleton),
    CONSTRAINT fence_floor_not_negative CHECK (floor >= 0)
);

COMMENT ON TABLE pgfence.fence_floor IS 'pgfence: every new fence exceeds floor; raised by pgfence.bump_fence';

INSERT INTO pgfence.fence_floor (floor)
SELECT greatest(s.last_value, coalesce((SELECT max(l.fence) FROM pgfence.leases AS l), 0))
  FROM pgfence.fence_seq AS s;

-- Every grant, renewal and release updates expires_at; with it indexed, none
-- of those updates could be HOT (heap-only: no new index entries), so each
-- wrote two index entries and left dead ones behind. Listing scans the
-- table, which holds one row per lease name. Free space on each page keeps
-- the new row version on the same page, as HOT needs.
DROP INDEX pgfence.leases_expires_at_idx;
ALTER TABLE pgfence.leases SET (fillfactor = 50);

DROP FUNCTION pgfence.bump_fence(bigint);
DROP FUNCTION pgfence.next_fence();
DROP FUNCTION pgfence.advance_epoch(bigint, boolean);
DROP FUNCTION pgfence.server_epoch();
DROP TABLE pgfence.fence_epoch;
DROP SEQUENCE pgfence.fence_seq;

-- wait_key is the advisory lock (two-int4 key space, class 1885824613 =
-- 'pgfe') that a waiter or observer of a lease holds shared while it
-- listens; a release sends a notification only when someone holds it.
-- Go's leases package computes the same key: the high 32 bits of lock_key.
CREATE FUNCTION pgfence.wait_key(lease text) RETURNS integer
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (pgfence.lock_key(lease) >> 32)::integer;

-- notify_waiters tells the waiters and observers of lease, if there are any,
-- that it is free. With nobody waiting it sends nothing: a transaction that
-- notifies serialises its commit with every other notifying transaction.
CREATE FUNCTION pgfence.notify_waiters(lease text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The exclusive try fails exactly when a waiter holds the key shared;
    -- when it succeeds it holds the key until commit, so a waiter that
    -- arrives meanwhile registers after this release and then sees it.
    IF NOT pg_try_advisory_xact_lock(1885824613, pgfence.wait_key(lease)) THEN
        PERFORM pg_notify('pgfence_leases', lease);
    END IF;
END
$$;

-- try_acquire grants lease to owner for ttl_us microseconds if nobody holds
-- it or the holder's grant has expired (database clock). granted says which;
-- the other columns describe the new grant, or else the holder's, with
-- remaining_us the time to its expiry. No row: the holder committed while
-- this call ran; ask again. A live grant is answered from the snapshot
-- without locking anything. A takeover first takes the lease's fence lock
-- (see token_fence) exclusively, so it waits for the previous holder's open
-- fenced transactions to end: their writes commit before the new grant.
CREATE FUNCTION pgfence.try_acquire(lease text, lease_owner text, ttl_us bigint,
        OUT granted boolean, OUT holder text, OUT fence bigint, OUT acquired_at timestamptz,
        OUT renewed_at timestamptz, OUT expires_at timestamptz, OUT remaining_us bigint)
    RETURNS SETOF record
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    min_fence bigint;
BEGIN
    IF ttl_us IS NULL OR ttl_us < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: ttl must be positive, got %s microseconds', coalesce(ttl_us::text, 'NULL'));
    END IF;
    RETURN QUERY
    SELECT false, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint
      FROM pgfence.leases AS c
     WHERE c.name = lease AND c.expires_at > clock_timestamp();
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT f.floor + 1 INTO min_fence FROM pgfence.fence_floor AS f;
    PERFORM pg_advisory_xact_lock(1885824614, pgfence.wait_key(lease));
    RETURN QUERY
    INSERT INTO pgfence.leases AS l (name, owner, fence, acquired_at, renewed_at, expires_at)
    VALUES (lease, lease_owner,
            greatest((extract(epoch FROM clock_timestamp()) * 1000000)::bigint, min_fence),
            clock_timestamp(), clock_timestamp(), clock_timestamp() + ttl_us * interval '1 microsecond')
    ON CONFLICT (name) DO UPDATE
       SET owner       = EXCLUDED.owner,
           fence       = greatest(l.fence + 1, EXCLUDED.fence),
           acquired_at = EXCLUDED.acquired_at,
           renewed_at  = EXCLUDED.renewed_at,
           expires_at  = EXCLUDED.expires_at,
           metadata    = NULL
     WHERE l.expires_at <= clock_timestamp()
    RETURNING true, l.owner, l.fence, l.acquired_at, l.renewed_at, l.expires_at, ttl_us;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Taken meanwhile (the upsert re-checked the newest version): report
    -- that holder from a new snapshot.
    RETURN QUERY
    SELECT false, c.owner, c.fence, c.acquired_at, c.renewed_at, c.expires_at,
           (extract(epoch FROM c.expires_at - clock_timestamp()) * 1000000)::bigint
      FROM pgfence.leases AS c
     WHERE c.name = lease AND c.expires_at > clock_timestamp();
END
$$;

-- renew extends one grant -- exactly (lease, owner, fence) -- to ttl_us from
-- now, waiting for row locks; NULL means the grant is no longer live: lost.
CREATE FUNCTION pgfence.renew(lease text, lease_owner text, lease_fence bigint, ttl_us bigint)
    RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    until timestamptz;
BEGIN
    IF ttl_us IS NULL OR ttl_us < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: ttl must be positive, got %s microseconds', coalesce(ttl_us::text, 'NULL'));
    END IF;
    UPDATE pgfence.leases AS l
       SET renewed_at = clock_timestamp(),
           expires_at = clock_timestamp() + ttl_us * interval '1 microsecond'
     WHERE l.name = lease AND l.owner = lease_owner AND l.fence = lease_fence
       AND l.expires_at > clock_timestamp()
    RETURNING l.expires_at INTO until;
    RETURN until;
END
$$;

-- renew_many renews many grants in one statement (a keepalive tick). Rows
-- locked by someone else (a takeover or force-release in progress) are
-- skipped, not waited for, and come back busy, to be retried soon. A grant
-- with expires_at NULL and busy false is lost.
CREATE FUNCTION pgfence.renew_many(leases text[], owners text[], fences bigint[], ttls_us bigint[])
    RETURNS TABLE (lease text, expires_at timestamptz, busy boolean)
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
        RETURNING l.name, l.expires_at
    )
    SELECT v.name, r.expires_at,
           r.name IS NULL AND EXISTS (
               SELECT FROM pgfence.leases AS l
                WHERE l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
                  AND l.expires_at > clock_timestamp())
      FROM v LEFT JOIN renewed AS r ON r.name = v.name;
END;

-- release ends one grant now. true: it was live and is released; false: it
-- had already expired; NULL: no such grant (superseded). The row stays,
-- expired, so that the next grant of the name exceeds its fence. Waiters,
-- if any, are notified.
CREATE FUNCTION pgfence.release(lease text, lease_owner text, lease_fence bigint)
    RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now  timestamptz := clock_timestamp();
    live boolean;
BEGIN
    UPDATE pgfence.leases AS l
       SET expires_at = least(l.expires_at, now)
     WHERE l.name = lease AND l.owner = lease_owner AND l.fence = lease_fence
    RETURNING l.expires_at = now INTO live;
    IF live THEN
        PERFORM pgfence.notify_waiters(lease);
    END IF;
    RETURN live;
END
$$;

-- release_many ends many grants now (a client closing, or grants it stopped
-- trusting) and returns the names it released.
CREATE FUNCTION pgfence.release_many(leases text[], owners text[], fences bigint[])
    RETURNS SETOF text
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    now  timestamptz := clock_timestamp();
    name text;
BEGIN
    FOR name IN
        UPDATE pgfence.leases AS l
           SET expires_at = least(l.expires_at, now)
          FROM unnest(leases, owners, fences) AS v(name, owner, fence)
         WHERE l.name = v.name AND l.owner = v.owner AND l.fence = v.fence
        RETURNING l.name
    LOOP
        PERFORM pgfence.notify_waiters(name);
        RETURN NEXT name;
    END LOOP;
END
$$;

-- force_release expires whatever grant lease has, now, and always notifies
-- (the holder's own client listens too). Like a takeover it first takes the
-- lease's fence lock exclusively, so that the holder's open fenced
-- transactions end first. Break-glass: it waits at most timeout_ms for that
-- -- a frozen holder inside an open fenced transaction holds it -- and then
-- fails with SQLSTATE 55P03 (lock_not_available).
-- true: a live grant was ended; false: it had expired; NULL: no such lease.
CREATE FUNCTION pgfence.force_release(lease text, timeout_ms integer DEFAULT 5000)
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

-- bump_fence raises the floor so that every later grant's fence exceeds
-- every fence in the table and the database clock by gap microseconds:
-- the operator's step when a server's clock may have been behind (see the
-- top of this file). Returns the new floor.
CREATE FUNCTION pgfence.bump_fence(gap bigint DEFAULT 3600000000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    base   numeric;
    target numeric;
BEGIN
    IF gap IS NULL OR gap < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: the fence gap must be a positive bigint, got %s', coalesce(gap::text, 'NULL'));
    END IF;
    SELECT greatest(f.floor,
                    coalesce((SELECT max(l.fence) FROM pgfence.leases AS l), 0),
                    (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
      INTO base
      FROM pgfence.fence_floor AS f
       FOR UPDATE;
    target := base + gap;
    IF target > 4611686018427387903 THEN -- keep half of bigint for the clock
        RAISE EXCEPTION USING
            ERRCODE = 'numeric_value_out_of_range',
            MESSAGE = format('pgfence: a fence floor of %s + %s is too high', base, gap);
    END IF;
    UPDATE pgfence.fence_floor SET floor = target::bigint, bumped_at = clock_timestamp();
    RETURN target::bigint;
END
$$;

-- declare_token declares the fencing token of the current transaction: the
-- grant (lease, fence) under which its writes to protected tables are made.
-- It binds the declaration to this transaction's id, so it is honoured by
-- no other transaction -- not after COMMIT or ROLLBACK, not through a pooled
-- connection. It checks nothing else: the guard checks the grant on each
-- write. This is the one way to declare a token in SQL:
--     BEGIN;
--     SELECT pgfence.declare_token('billing', 1764547200123456);
--     UPDATE invoices SET ... ;   -- checked by the guard
--     COMMIT;
CREATE FUNCTION pgfence.declare_token(lease text, fence bigint) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lease IS NULL OR octet_length(lease) NOT BETWEEN 1 AND 200 OR fence IS NULL OR fence < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: invalid fencing token %L#%s: a token names a lease (1..200 bytes) and a positive fence',
                             lease, coalesce(fence::text, 'NULL'));
    END IF;
    PERFORM set_config('pgfence.token', pg_current_xact_id()::text || ':' || fence::text || ':' || lease, true);
END
$$;

-- token_fence is the fence of the token declared for the current
-- transaction, after checking that it is honoured: declared by
-- declare_token in this transaction (PF002 otherwise), and the current,
-- unexpired grant of the lease it names (PF001 otherwise).
--
-- The fence lock. Before it reads the lease it takes the lease's fence lock
-- -- the advisory lock (1885824614 = 'pgff', wait_key(lease)) -- shared, until
-- the transaction ends. A takeover (try_acquire) and a force-release take it
-- exclusively, so none commits while this transaction is open: either this
-- transaction commits first (and the next holder, granted afterwards, sees
-- its writes), or the takeover came first, and the read below, taken after
-- the lock was granted, sees the new fence and rejects the token. Never
-- both. An advisory lock lives in the lock manager: unlike a row lock it
-- writes no WAL, makes no MultiXact however many writers share it, and
-- blocks no renewal. Under REPEATABLE READ or SERIALIZABLE the transaction's
-- snapshot may predate a takeover it waited for, so there the lease row is
-- also share-locked, which turns that case into a serialization failure.
CREATE FUNCTION pgfence.token_fence(tbl regclass) RETURNS bigint
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

-- fence_guard is the row trigger protect installs, for INSERT, UPDATE and
-- DELETE: it rejects a write unless the transaction's token is honoured
-- (token_fence), rejects a token lower than the fence stored in the row
-- (PF001), and stores the token's fence in the row. The column named
-- "fence" is read and written directly; any other name goes through jsonb.
CREATE OR REPLACE FUNCTION pgfence.fence_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    col    text   := TG_ARGV[0];
    tok    bigint := pgfence.token_fence(TG_RELID);
    stored bigint;
BEGIN
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

-- fence_guard_truncate is the statement trigger protect installs for
-- TRUNCATE (row triggers do not fire there). It runs as the truncating
-- role: with row-level security active for that role it refuses, since the
-- role cannot see -- and so cannot check -- every row it would remove;
-- otherwise the token must be honoured and not lower than any fence stored
-- in the table or below it (so TRUNCATE of a parent is checked even for a
-- partition attached after protect, whose own TRUNCATE is not).
CREATE FUNCTION pgfence.fence_guard_truncate() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    tok    bigint := pgfence.token_fence(TG_RELID);
    stored bigint;
BEGIN
    IF row_security_active(TG_RELID) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF001',
            MESSAGE = format('pgfence: TRUNCATE of %I.%I refused: row-level security hides rows whose fences cannot be checked',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME),
            HINT    = 'DELETE the rows instead: the guard checks each one',
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;
    EXECUTE format('SELECT max(%I) FROM %I.%I', TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME) INTO stored;
    IF tok < stored THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF001',
            MESSAGE = format('pgfence: stale fencing token: fence %s is lower than the fence %s stored in %I.%I',
                             tok, stored, TG_TABLE_SCHEMA, TG_TABLE_NAME),
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;
    RETURN NULL;
END
$$;

-- protect installs the guard on an ordinary or partitioned table whose fence
-- column is bigint, and on every table below it -- partitions and
-- inheritance children, present ones: a BEFORE row trigger for INSERT,
-- UPDATE and DELETE (pgfence_guard; a partition has it cloned from its
-- parent) and a BEFORE statement trigger for TRUNCATE
-- (pgfence_guard_truncate). Safe to repeat; repeat it after attaching a
-- partition or adding a child (`pgfence check` reports any left unguarded).
CREATE OR REPLACE FUNCTION pgfence.protect(tbl regclass, fence_column name DEFAULT 'fence') RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    typ  oid;
    rel  regclass;
BEGIN
    SELECT c.relkind INTO kind FROM pg_class AS c WHERE c.oid = tbl;
    IF kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'wrong_object_type',
            MESSAGE = format('pgfence.protect: %s is not a table', tbl);
    END IF;
    FOR rel IN
        WITH RECURSIVE tree(relid) AS (
            SELECT tbl::oid
            UNION
            SELECT i.inhrelid FROM pg_inherits AS i JOIN tree ON i.inhparent = tree.relid
        )
        SELECT t.relid::regclass FROM tree AS t
    LOOP
        SELECT a.atttypid INTO typ
          FROM pg_attribute AS a
         WHERE a.attrelid = rel
           AND a.attname = fence_column
           AND a.attnum > 0
           AND NOT a.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'undefined_column',
                MESSAGE = format('pgfence.protect: table %s has no column %I', rel, fence_column),
                HINT    = format('ALTER TABLE %s ADD COLUMN %I bigint NOT NULL DEFAULT 0', rel, fence_column);
        END IF;
        IF typ <> 'bigint'::regtype THEN
            RAISE EXCEPTION USING
                ERRCODE = 'datatype_mismatch',
                MESSAGE = format('pgfence.protect: column %I of %s is %s, want bigint', fence_column, rel, typ::regtype),
                HINT    = format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', rel, fence_column);
        END IF;
        -- A partition has the row trigger cloned from its parent (and it
        -- cannot be replaced there); an inheritance child needs its own.
        IF NOT EXISTS (SELECT FROM pg_trigger AS t
                        WHERE t.tgrelid = rel AND t.tgname = 'pgfence_guard' AND t.tgparentid <> 0) THEN
            EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION pgfence.fence_guard(%L)', rel, fence_column);
        END IF;
        EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence.fence_guard_truncate(%L)', rel, fence_column);
    END LOOP;
END
$$;

-- Existing protected tables: TRUNCATE goes through the new function.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT tg.tgrelid::regclass AS tbl, a.attname AS col
          FROM pg_trigger AS tg
          JOIN pg_attribute AS a ON a.attrelid = tg.tgrelid
         WHERE tg.tgname = 'pgfence_guard_truncate'
           AND tg.tgfoid = 'pgfence.fence_guard()'::regprocedure
           AND a.attname = convert_from(substring(tg.tgargs FROM 1 FOR position(decode('00', 'hex') IN tg.tgargs) - 1), 'UTF8')
    LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence.fence_guard_truncate(%L)', t.tbl, t.col);
    END LOOP;
END
$$;

-- unguarded lists the tables below a protected table (partitions and
-- inheritance children) that lack one of the guard's triggers: attached or
-- created after protect ran. `pgfence check` reports them; protect fixes them.
CREATE FUNCTION pgfence.unguarded(OUT tbl regclass, OUT parent regclass, OUT missing text)
    RETURNS SETOF record
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH RECURSIVE guarded AS (
        SELECT DISTINCT t.tgrelid AS relid FROM pg_trigger AS t WHERE t.tgname = 'pgfence_guard' AND t.tgparentid = 0
    ), tree(relid, root) AS (
        SELECT g.relid, g.relid FROM guarded AS g
        UNION
        SELECT i.inhrelid, tree.root FROM pg_inherits AS i JOIN tree ON i.inhparent = tree.relid
    )
    SELECT tree.relid::regclass, tree.root::regclass,
           concat_ws(', ',
               CASE WHEN NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard')
                    THEN 'pgfence_guard' END,
               CASE WHEN NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard_truncate')
                    THEN 'pgfence_guard_truncate' END)
      FROM tree
     WHERE NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard')
        OR NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard_truncate')
     ORDER BY 1;
END;

-- Privileges. Nothing in the schema is PUBLIC's any more; the roles get
-- what they need. Direct write privileges on pgfence.leases granted to any
-- role before (the README of version 3 told operators to) are revoked: a
-- role that can UPDATE the lease table can forge grants.
REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM PUBLIC;
DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT DISTINCT c.oid::regclass AS tbl, a.grantee::regrole AS grantee
          FROM pg_class AS c, aclexplode(c.relacl) AS a
         WHERE c.relnamespace = 'pgfence'::regnamespace
           AND a.grantee <> 0 AND a.grantee <> c.relowner
           AND a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER')
    LOOP
        EXECUTE format('REVOKE INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON %s FROM %s', g.tbl, g.grantee);
    END LOOP;
END
$$;

-- grant_roles gives pgfence_client and pgfence_operator their privileges in
-- this database. The migration calls it; call it again (as the role that
-- migrated) after creating the roles by hand.
CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RAISE NOTICE 'pgfence: roles pgfence_client and pgfence_operator do not exist; no privileges granted';
        RETURN;
    END IF;
    -- An application: leases (take, renew, release, read), advisory-lock
    -- keys, fenced writes.
    GRANT USAGE ON SCHEMA pgfence TO pgfence_client;
    GRANT SELECT ON pgfence.leases, pgfence.lease_status TO pgfence_client;
    GRANT EXECUTE ON FUNCTION
        pgfence.lock_key(text),
        pgfence.wait_key(text),
        pgfence.try_acquire(text, text, bigint),
        pgfence.renew(text, text, bigint, bigint),
        pgfence.renew_many(text[], text[], bigint[], bigint[]),
        pgfence.release(text, text, bigint),
        pgfence.release_many(text[], text[], bigint[]),
        pgfence.declare_token(text, bigint),
        pgfence.token_fence(regclass)
        TO pgfence_client;
    -- An operator: that, plus break-glass and the checks. The membership
    -- is cluster-wide, so the first database's migration grants it; a later
    -- database's migration role need not, and may not be able to: granting
    -- a role takes ADMIN OPTION on it (before PostgreSQL 16, CREATEROLE
    -- did too).
    IF NOT EXISTS (SELECT FROM pg_auth_members
                    WHERE roleid = 'pgfence_client'::regrole AND member = 'pgfence_operator'::regrole) THEN
        BEGIN
            GRANT pgfence_client TO pgfence_operator;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE NOTICE USING
                MESSAGE = 'pgfence: could not grant pgfence_client to pgfence_operator, so operators are not clients',
                HINT    = 'as a superuser or a role with ADMIN OPTION on pgfence_client run: GRANT pgfence_client TO pgfence_operator;';
        END;
    END IF;
    GRANT SELECT ON pgfence.fence_floor TO pgfence_operator;
    GRANT EXECUTE ON FUNCTION
        pgfence.force_release(text, integer),
        pgfence.bump_fence(bigint),
        pgfence.unguarded()
        TO pgfence_operator;
    -- Seeing and ending the backend that blocks a force-release needs these
    -- built-in roles; only a role that administers them can grant them.
    BEGIN
        GRANT pg_read_all_stats, pg_signal_backend TO pgfence_operator;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE NOTICE 'pgfence: could not grant pg_read_all_stats and pg_signal_backend to pgfence_operator; a superuser may';
    END;
END
$$;

-- protect acts only on tables the caller owns (CREATE TRIGGER checks), so
-- any table owner may call it. Triggers need no EXECUTE to fire; the guard
-- calls token_fence as the writing role, which therefore needs
-- pgfence_client: a role without it cannot write a protected table at all.
GRANT EXECUTE ON FUNCTION pgfence.protect(regclass, name) TO PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
