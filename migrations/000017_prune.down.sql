-- Reverts 000017_prune.up.sql: grant_roles as migration 13 left it, and
-- no pgfence.prune. Rows it deleted stay deleted; the fence floor it
-- raised stays raised, which keeps every later fence above theirs.
BEGIN;

DROP FUNCTION pgfence.grant_roles();
ALTER FUNCTION pgfence.grant_roles_13() RENAME TO grant_roles;
DROP FUNCTION pgfence.prune(bigint, integer);

COMMIT;
