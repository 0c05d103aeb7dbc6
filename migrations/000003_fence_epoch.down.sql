-- Reverses 000003_fence_epoch.up.sql. A leases client built for version 3
-- draws fences through pgfence.next_fence() and fails without it (the error
-- says to run `pgfence migrate up`).
BEGIN;
DROP FUNCTION pgfence.bump_fence(bigint);
DROP FUNCTION pgfence.next_fence();
DROP FUNCTION pgfence.advance_epoch(bigint, boolean);
DROP FUNCTION pgfence.server_epoch();
DROP TABLE pgfence.fence_epoch;
COMMIT;
