-- pgfence grants, version 11: pgfence.grant_roles() gives the roles
-- migration 5's privileges too. Migration 5 granted its functions directly,
-- where the roles existed, and left grant_roles as it was; so roles created
-- after the migrations, then granted with grant_roles() as
-- docs/operators.md says, got no EXECUTE on try_acquire with data (every
-- grant of the leases package), set_data, renew_batch (every renewal) or
-- request_handover, and their clients failed with permission denied.
--
-- As migration 6 did, grant_roles is renamed (grant_roles_6) and called
-- first by the new one. The migration ends by calling it, which mends a
-- database whose roles were granted that way before.
--
-- It also takes EXECUTE on grant_roles_4 (migration 4's grant_roles,
-- renamed by migration 6) from PUBLIC, which had it by default: harmless,
-- as it runs with its caller's privileges, but nothing else in schema
-- pgfence is PUBLIC's except protect.
BEGIN;

REVOKE ALL ON FUNCTION pgfence.grant_roles_4() FROM PUBLIC;

ALTER FUNCTION pgfence.grant_roles() RENAME TO grant_roles_6;

CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgfence.grant_roles_6();
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RETURN; -- grant_roles_4 said so
    END IF;
    GRANT EXECUTE ON FUNCTION
        pgfence.try_acquire(text, text, bigint, text),
        pgfence.set_data(text, text, bigint, text),
        pgfence.renew_batch(text[], text[], bigint[], bigint[])
        TO pgfence_client;
    GRANT EXECUTE ON FUNCTION pgfence.request_handover(text) TO pgfence_operator;
END
$$;

REVOKE ALL ON FUNCTION pgfence.grant_roles() FROM PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
