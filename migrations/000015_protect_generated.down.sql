-- Reverts 000015_protect_generated.up.sql: protect as migration 4 created
-- it.
BEGIN;

CREATE OR REPLACE FUNCTION pgfence.protect(tbl regclass, fence_column name DEFAULT 'fence') RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    typ  oid;
    rel  regclass;
BEGIN
    SELECT c.relkind INTO kind FROM pg_class AS c WHERE c.oid = tbl;
    IF kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'wrong_object_type',
            MESSAGE = format('pgfence.protect: %s is not a table', tbl);
    END IF;
    FOR rel IN
        WITH RECURSIVE tree(relid) AS (
            SELECT tbl::oid
            UNION
            SELECT i.inhrelid FROM pg_inherits AS i JOIN tree ON i.inhparent = tree.relid
        )
        SELECT t.relid::regclass FROM tree AS t
    LOOP
        SELECT a.atttypid INTO typ
          FROM pg_attribute AS a
         WHERE a.attrelid = rel
           AND a.attname = fence_column
           AND a.attnum > 0
           AND NOT a.attisdropped;
        IF NOT FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'undefined_column',
                MESSAGE = format('pgfence.protect: table %s has no column %I', rel, fence_column),
                HINT    = format('ALTER TABLE %s ADD COLUMN %I bigint NOT NULL DEFAULT 0', rel, fence_column);
        END IF;
        IF typ <> 'bigint'::regtype THEN
            RAISE EXCEPTION USING
                ERRCODE = 'datatype_mismatch',
                MESSAGE = format('pgfence.protect: column %I of %s is %s, want bigint', fence_column, rel, typ::regtype),
                HINT    = format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', rel, fence_column);
        END IF;
        -- A partition has the row trigger cloned from its parent (and it
        -- cannot be replaced there); an inheritance child needs its own.
        IF NOT EXISTS (SELECT FROM pg_trigger AS t
                        WHERE t.tgrelid = rel AND t.tgname = 'pgfence_guard' AND t.tgparentid <> 0) THEN
            EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                           'FOR EACH ROW EXECUTE FUNCTION pgfence.fence_guard(%L)', rel, fence_column);
        END IF;
        EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence.fence_guard_truncate(%L)', rel, fence_column);
    END LOOP;
END
$$;

COMMIT;
