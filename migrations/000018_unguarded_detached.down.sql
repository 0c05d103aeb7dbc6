-- Reverts 000018_unguarded_detached.up.sql: unguarded as migration 16
-- created it, with pg_catalog alone on the path.
BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION pgfence.unguarded(OUT tbl regclass, OUT parent regclass, OUT missing text)
    RETURNS SETOF record
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH RECURSIVE guarded AS (
        SELECT DISTINCT t.tgrelid AS relid FROM pg_trigger AS t WHERE t.tgname = 'pgfence_guard' AND t.tgparentid = 0
    ), tree(relid, root) AS (
        SELECT g.relid, g.relid FROM guarded AS g
        UNION
        SELECT i.inhrelid, tree.root FROM pg_inherits AS i JOIN tree ON i.inhparent = tree.relid
    )
    SELECT tree.relid::regclass, tree.root::regclass,
           concat_ws(', ',
               CASE WHEN NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard')
                    THEN 'pgfence_guard' END,
               CASE WHEN NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard_truncate')
                    THEN 'pgfence_guard_truncate' END)
      FROM tree
     WHERE NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard')
        OR NOT EXISTS (SELECT FROM pg_trigger AS t WHERE t.tgrelid = tree.relid AND t.tgname = 'pgfence_guard_truncate')
     ORDER BY 1;
END;

COMMIT;
