-- pgfence.lease_status: the leases as an operator reads them, computed by
-- the database clock, so SQL-based monitoring can alert without the Go
-- library, e.g.
--   SELECT name, owner, held_for FROM pgfence.lease_status
--    WHERE NOT expired AND held_for > interval '1 hour';
BEGIN;

CREATE VIEW pgfence.lease_status AS
SELECT l.name,
       l.owner,
       l.fence,
       l.acquired_at,
       l.renewed_at,
       l.expires_at,
       clock_timestamp() - l.acquired_at AS held_for,
       l.expires_at - clock_timestamp()  AS expires_in,
       l.expires_at <= clock_timestamp() AS expired
  FROM pgfence.leases AS l;

COMMENT ON VIEW pgfence.lease_status IS 'pgfence leases with held_for, expires_in and expired by the database clock';

COMMIT;
