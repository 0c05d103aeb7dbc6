-- Reverts 000005_lease_features.up.sql: exactly its functions and column.
-- Data stored in pgfence.leases.metadata stays (the column is migration 1's).
BEGIN;

DROP FUNCTION pgfence.request_handover(text);
DROP FUNCTION pgfence.renew_batch(text[], text[], bigint[], bigint[]);
DROP FUNCTION pgfence.set_data(text, text, bigint, text);
DROP FUNCTION pgfence.try_acquire(text, text, bigint, text);
DROP FUNCTION pgfence.check_data(text);
ALTER TABLE pgfence.leases DROP COLUMN handover_fence;
COMMENT ON COLUMN pgfence.leases.metadata IS NULL;

COMMIT;
