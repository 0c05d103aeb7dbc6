-- pgfence prune, version 17: pgfence.prune deletes lease rows expired
-- long ago.
--
-- Rows used never to be deleted, so that the next grant of a name always
-- had the previous fence to exceed (docs/design.md, "Fences"); a service
-- that names its leases after entities (a lease per invoice, per tenant)
-- grew the table without bound. prune deletes the rows whose grant
-- expired before clock_timestamp() - older_than_us microseconds and, in
-- the same transaction, raises pgfence.fence_floor to the highest fence it
-- deleted: every later grant's fence is at least floor + 1, so a deleted
-- name's next grant still gets a higher fence than any it had, and any
-- fence stored in a protected row by it is still exceeded.
--
-- A row is left for a later call when its fence lock is held (a fenced
-- transaction of its last holder is still open) or when another
-- transaction has locked it (a grant taking it now). The fence
-- lock is tried only on rows already found expired: CASE fixes the order,
-- which the planner may change between AND-ed conditions, and a held
-- fence lock of a live lease would stall its holder's fenced writes until
-- this transaction ends. At most max_rows rows per call, so that one
-- call's transaction and its locks stay short; it returns how many rows
-- it deleted. Operators only (pgfence_operator).
BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

CREATE FUNCTION pgfence.prune(older_than_us bigint, max_rows integer DEFAULT 10000)
    RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff  timestamptz;
    n       bigint;
    highest bigint;
BEGIN
    IF older_than_us IS NULL OR older_than_us < 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: prune: older_than must be 0 or more microseconds, got %s', coalesce(older_than_us::text, 'NULL'));
    END IF;
    IF max_rows IS NULL OR max_rows < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: prune: max_rows must be positive, got %s', coalesce(max_rows::text, 'NULL'));
    END IF;
    cutoff := clock_timestamp() - older_than_us * interval '1 microsecond';
    WITH doomed AS (
        SELECT l.name
          FROM pgfence.leases AS l
         WHERE CASE WHEN l.expires_at < cutoff
                    THEN pg_try_advisory_xact_lock(1885824614, pg_catalog.hashtext(l.name))
                    ELSE false END
         LIMIT max_rows
           FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM pgfence.leases AS l
         USING doomed AS d
         WHERE l.name = d.name
        RETURNING l.fence
    )
    SELECT count(*), max(g.fence) INTO n, highest FROM gone AS g;
    IF highest IS NOT NULL THEN
        UPDATE pgfence.fence_floor AS f SET floor = highest WHERE f.floor < highest;
    END IF;
    RETURN n;
END
$$;

REVOKE ALL ON FUNCTION pgfence.prune(bigint, integer) FROM PUBLIC;

-- grant_roles grants it too, as migration 13's did for migration 12.
ALTER FUNCTION pgfence.grant_roles() RENAME TO grant_roles_13;

CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgfence.grant_roles_13();
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RETURN; -- grant_roles_4 said so
    END IF;
    GRANT EXECUTE ON FUNCTION pgfence.prune(bigint, integer) TO pgfence_operator;
END
$$;

REVOKE ALL ON FUNCTION pgfence.grant_roles() FROM PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
