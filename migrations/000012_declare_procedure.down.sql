-- Reverts 000012_declare_procedure.up.sql: grant_roles as migration 11
-- left it, and no procedure pgfence.declare. Clients that declare with it
-- (fencing.Begin of the version that brought this migration) fail until
-- the migration is applied again.
BEGIN;

DROP FUNCTION pgfence.grant_roles();
ALTER FUNCTION pgfence.grant_roles_11() RENAME TO grant_roles;
DROP PROCEDURE pgfence.declare(text, bigint);

COMMIT;
