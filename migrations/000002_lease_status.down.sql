BEGIN;
DROP VIEW pgfence.lease_status;
COMMIT;
