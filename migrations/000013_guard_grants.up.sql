-- pgfence privileges, version 13: two gaps in migration 4's.
--
-- A table's owner could not protect it unless it was the role that ran the
-- migrations (or a superuser): CREATE TRIGGER needs EXECUTE on the trigger
-- function, and nobody else had it on pgfence.fence_guard and
-- fence_guard_truncate, so pgfence.protect failed with "permission denied
-- for function pgfence.fence_guard". pgfence_client gets it: an
-- application role that owns its tables protects them itself
-- (fencing.Protect). PostgreSQL runs a trigger function only as a
-- trigger, so the grant lets a role do no more than guard tables it may
-- put triggers on.
--
-- Migration 4 revoked the direct write privileges on pgfence's tables
-- granted at table level, not those granted on columns (GRANT UPDATE
-- (fence, owner, expires_at) ON pgfence.leases): a role holding one could
-- still forge a grant or set a fence back. They are revoked now, from
-- every role but the tables' owner.
BEGIN;

DO $$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT c.oid::regclass AS tbl, att.attname, a.privilege_type AS priv,
               CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(a.grantee::regrole::text) END AS grantee
          FROM pg_class AS c
          JOIN pg_attribute AS att ON att.attrelid = c.oid
         CROSS JOIN LATERAL aclexplode(att.attacl) AS a
         WHERE c.relnamespace = 'pgfence'::regnamespace
           AND att.attnum > 0 AND NOT att.attisdropped
           AND a.grantee <> c.relowner
           AND a.privilege_type IN ('INSERT', 'UPDATE', 'REFERENCES')
    LOOP
        EXECUTE format('REVOKE %s (%I) ON %s FROM %s', g.priv, g.attname, g.tbl, g.grantee);
    END LOOP;
END
$$;

-- grant_roles grants it too, as migration 12's did for the procedure.
ALTER FUNCTION pgfence.grant_roles() RENAME TO grant_roles_12;

CREATE FUNCTION pgfence.grant_roles() RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM pgfence.grant_roles_12();
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client')
       OR NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        RETURN; -- grant_roles_4 said so
    END IF;
    GRANT EXECUTE ON FUNCTION pgfence.fence_guard(), pgfence.fence_guard_truncate() TO pgfence_client;
END
$$;

REVOKE ALL ON FUNCTION pgfence.grant_roles() FROM PUBLIC;

SELECT pgfence.grant_roles();

COMMIT;
