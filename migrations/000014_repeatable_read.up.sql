-- pgfence fenced writes, version 14: two answers of the guard under
-- REPEATABLE READ and SERIALIZABLE, found wrong by an audit.
--
-- token_fence read the lease with "expires_at > clock_timestamp()" in its
-- query, which tests the expiry the transaction's snapshot shows. A holder
-- whose keepalive renewed the lease after the snapshot was taken got
-- PF001 (ErrStale: "you lost, stop") once the expiry before the renewal
-- had passed, although its grant was live and the same token wrote in the
-- next transaction. It now share-locks the lease's row whatever its
-- expiry and checks the expiry after: a row changed since the snapshot
-- raises a serialization failure (40001, to retry, as a renewal just
-- after the snapshot already did), an unchanged one is the current row.
--
-- fence_guard_truncate checked rule (b) against max(fence) read with the
-- transaction's snapshot, but TRUNCATE also removes rows committed after
-- it, which the guard never saw: under REPEATABLE READ a TRUNCATE removed
-- rows of a higher fence that READ COMMITTED refuses to. TRUNCATE of a
-- protected table is now refused outside READ COMMITTED (0A000), as it is
-- under row-level security: TRUNCATE under READ COMMITTED, or DELETE.
--
-- Nothing else changes: the fence lock keeps its key, and READ COMMITTED
-- writes do not call token_fence.
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
    expires timestamptz;
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
        -- The row as the snapshot shows it, share-locked: if a renewal,
        -- release or grant has changed it since, the lock raises a
        -- serialization failure (40001), to retry; else it is the current
        -- row, whose expiry is then checked. (Filtering on the expiry in
        -- the query tested the snapshot's: a renewal after the snapshot
        -- made the current holder's token look stale.)
        SELECT l.fence, l.expires_at INTO current, expires
          FROM pgfence.leases AS l
         WHERE l.name = lease
           FOR SHARE;
        IF expires <= clock_timestamp() THEN
            current := NULL;
        END IF;
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
    tok    bigint;
    stored bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION USING
            ERRCODE = '0A000',
            MESSAGE = format('pgfence: TRUNCATE of %I.%I refused under %s: its snapshot hides rows committed since, whose fences cannot be checked',
                             TG_TABLE_SCHEMA, TG_TABLE_NAME, upper(current_setting('transaction_isolation'))),
            HINT    = 'TRUNCATE under READ COMMITTED, or DELETE the rows instead: the guard checks each one',
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;
    tok := pgfence.token_fence(TG_RELID);
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
