-- Reverts 000014_repeatable_read.up.sql: token_fence as migration 10 left
-- it and fence_guard_truncate as migration 4 created it.
BEGIN;

CREATE OR REPLACE FUNCTION pgfence.token_fence(tbl regclass) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    decl    text := current_setting('pgfence.token', true);
    xid     text;
    digits  text;
    lease   text;
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
    IF xid <> pg_current_xact_id()::text OR lease = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: write to %s declares no fencing token for this transaction', tbl),
            HINT    = 'a token is declared per transaction with pgfence.declare_token; a session-level or earlier declaration is not honoured';
    END IF;
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
    -- As in fence_guard: the digits must spell the current grant's fence as
    -- int8out writes it; their form is checked only on the way to an error.
    IF current IS NULL OR current::text <> digits THEN
        IF length(digits) NOT BETWEEN 1 AND 19 OR left(digits, 1) = '0' OR translate(digits, '0123456789', '') <> '' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF002',
                MESSAGE = format('pgfence: write to %s declares no fencing token for this transaction', tbl),
                HINT    = 'a token is declared per transaction with pgfence.declare_token; a session-level or earlier declaration is not honoured';
        END IF;
        RAISE EXCEPTION USING
            ERRCODE = 'PF001',
            MESSAGE = format('pgfence: stale fencing token: lease %L fence %s is not the current unexpired grant (current %s)',
                             lease, digits, coalesce(current::text, 'none'));
    END IF;
    RETURN current;
END
$$;

CREATE OR REPLACE FUNCTION pgfence.fence_guard_truncate() RETURNS trigger
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

COMMIT;
