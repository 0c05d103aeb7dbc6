-- Reverts 000008_fenced_write_path.up.sql: the definitions migration 4
-- gave declare_token and fence_guard, verbatim.
BEGIN;

CREATE OR REPLACE FUNCTION pgfence.declare_token(lease text, fence bigint) RETURNS void
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

COMMIT;
