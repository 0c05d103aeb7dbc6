-- pgfence fenced writes, version 8: the same checks as migration 4, for a
-- sixth less of the server work that fencing adds to a one-row
-- transaction (counted in instructions; docs/performance.md has the
-- figures).
--
-- 1. fence_guard checks the token itself under READ COMMITTED, the
--    isolation level nearly every fenced transaction runs at, instead of
--    calling token_fence: one PL/pgSQL call, search_path switch and
--    SECURITY DEFINER switch fewer per row written. It runs as the writing
--    role, which has pgfence_client (migration 4: a role without it cannot
--    write a protected table) and so may read pgfence.leases. Under
--    REPEATABLE READ and SERIALIZABLE it calls token_fence as before: the
--    lease row's share lock there needs the owner's privileges.
--
-- 2. declare_token drops its SET search_path. It is not SECURITY DEFINER:
--    it runs with its caller's privileges, and names every function,
--    operator and type schema-qualified, so a caller's search_path cannot
--    change what it does.
BEGIN;

CREATE OR REPLACE FUNCTION pgfence.declare_token(lease text, fence bigint) RETURNS void
    LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    ignored pg_catalog.text;
BEGIN
    IF lease IS NULL OR fence IS NULL
       OR pg_catalog.octet_length(lease) OPERATOR(pg_catalog.<) 1
       OR pg_catalog.octet_length(lease) OPERATOR(pg_catalog.>) 200
       OR fence OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = pg_catalog.format('pgfence: invalid fencing token %L#%s: a token names a lease (1..200 bytes) and a positive fence',
                                        lease, COALESCE(fence::pg_catalog.text, 'NULL'));
    END IF;
    -- An assignment, not PERFORM: PERFORM runs a query through the executor.
    ignored := pg_catalog.set_config('pgfence.token',
                                     pg_catalog.concat(pg_catalog.pg_current_xact_id(), ':', fence, ':', lease), true);
END
$$;

-- fence_guard, as migration 4's, with token_fence's READ COMMITTED path
-- written out in it: the same parse of "xid:fence:lease", the fence lock
-- taken shared before the lease row is read, the same errors.
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
