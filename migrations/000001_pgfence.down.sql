-- Reverses 000001_pgfence.up.sql: removes the guard triggers pgfence.protect
-- installed, then every object of schema pgfence. Nothing is dropped with
-- CASCADE, so an application object that depends on pgfence (a view over
-- pgfence.leases, say) makes this fail loudly instead of vanishing.
BEGIN;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT tg.tgname, tg.tgrelid::regclass AS tbl
          FROM pg_trigger AS tg
         WHERE tg.tgfoid = 'pgfence.fence_guard()'::regprocedure
           AND tg.tgparentid = 0 -- a partition's clone goes with its parent's trigger
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', t.tgname, t.tbl);
    END LOOP;
END
$$;

DROP FUNCTION pgfence.protect(regclass, name);
DROP FUNCTION pgfence.fence_guard();
DROP FUNCTION pgfence.lock_key(text);
DROP TABLE pgfence.leases;
DROP SEQUENCE pgfence.fence_seq;
DROP SCHEMA pgfence;

COMMIT;
