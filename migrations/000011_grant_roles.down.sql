-- Reverts 000011_grant_roles.up.sql: grant_roles as migration 6 left it.
-- The privileges it granted stay (migration 5 grants the same ones where
-- the roles exist), and PUBLIC does not get EXECUTE on grant_roles_4 back.
BEGIN;

DROP FUNCTION pgfence.grant_roles();
ALTER FUNCTION pgfence.grant_roles_6() RENAME TO grant_roles;

COMMIT;
