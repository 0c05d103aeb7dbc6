-- pgfence fenced writes, version 12: the procedure pgfence.declare(lease,
-- fence), the same declaration as pgfence.declare_token, run by CALL.
--
-- fencing.Begin sends the declaration in the message that opens the
-- transaction. As "SELECT pgfence.declare_token(...)" PostgreSQL plans it
-- and sends back a row on every transaction; as "CALL pgfence.declare(...)"
-- it does neither. That is 20 k fewer server instructions per fenced
-- transaction, of the 170 k fencing adds to a one-row UPDATE
-- (docs/performance.md has the figures). declare_token stays, unchanged:
-- clients of earlier versions call it, and it works where only a SELECT
-- can go.
--
-- The body is declare_token's: it runs with its caller's privileges, names
-- every function, operator and type schema-qualified (so a caller's
-- search_path cannot change what it does), and binds the token to the
-- transaction's id. Nothing else changes.
BEGIN;

CREATE PROCEDURE pgfence.declare(lease text, fence bigint)
    LANGUAGE plpgsql
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

REVOKE ALL ON PROCEDURE pgfence.declare(text, bigint) FROM PUBLIC;

-- grant_roles grants it too, as migration 11's did for migration 5.
ALTER FUNCTION pgfence.grant_roles() RENAME TO grant_roles_11;

CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgfence.grant_roles_11();
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RETURN; -- grant_roles_4 said so
    END IF;
    GRANT EXECUTE ON PROCEDURE pgfence.declare(text, bigint) TO pgfence_client;
END
$$;

REVOKE ALL ON FUNCTION pgfence.grant_roles() FROM PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
