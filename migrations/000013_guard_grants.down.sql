-- Reverts 000013_guard_grants.up.sql: grant_roles as migration 12 left it,
-- and no EXECUTE on the guard's functions for pgfence_client (a table's
-- owner protects it only as the migration role again). Revoked column
-- privileges are not granted back.
BEGIN;

DROP FUNCTION pgfence.grant_roles();
ALTER FUNCTION pgfence.grant_roles_12() RENAME TO grant_roles;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client') THEN
        REVOKE EXECUTE ON FUNCTION pgfence.fence_guard(), pgfence.fence_guard_truncate() FROM pgfence_client;
    END IF;
END
$$;

COMMIT;
