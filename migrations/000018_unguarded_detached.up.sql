-- pgfence.unguarded, version 18: half-guarded tables that left a tree.
--
-- unguarded() lists the tables below a protected table that lack one of
-- the guard's triggers. A table left the tree unlisted: a partition
-- DETACHed from a protected table loses the row guard cloned from its
-- parent and keeps the TRUNCATE guard protect gave it, and a child made
-- NO INHERIT keeps its triggers; neither is below anything any more, and
-- migration 4's function started only from tables with a row guard of
-- their own. Writes to such a partition are not fenced while the table
-- looks protected. A table with a TRUNCATE guard that is nobody's child is
-- now a root too: listed, missing pgfence_guard, until protect runs on it
-- again or its pgfence_guard_truncate is dropped. Created, like migration
-- 16's, with pg_catalog alone on the path.
BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION pgfence.unguarded(OUT tbl regclass, OUT parent regclass, OUT missing text)
    RETURNS SETOF record
    LANGUAGE sql STABLE
    SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH RECURSIVE guarded AS (
        SELECT t.tgrelid AS relid FROM pg_trigger AS t WHERE t.tgname = 'pgfence_guard' AND t.tgparentid = 0
        UNION
        SELECT t.tgrelid FROM pg_trigger AS t
         WHERE t.tgname = 'pgfence_guard_truncate'
           AND NOT EXISTS (SELECT FROM pg_inherits AS i WHERE i.inhrelid = t.tgrelid)
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
