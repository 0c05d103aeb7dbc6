-- pgfence SQL bodies, version 16: bound to PostgreSQL's built-ins.
--
-- A function written as a SQL body (RETURN ..., BEGIN ATOMIC) is parsed
-- when it is created, with the search path of the session creating it:
-- its own SET search_path applies only when it runs. The migrations ran
-- with the migration role's path ("$user", public), and where another role
-- could create objects in a schema on it (public, before PostgreSQL 15),
-- a look-alike that matches an argument better than the built-in was
-- chosen and stays bound: convert_to(text, text) in lock_key, which
-- release and notify_waiters (SECURITY DEFINER) call through wait_key; an
-- operator = (oid, integer) and concat_ws(text, text, text) in
-- unguarded, which operators run. Both are created again, unchanged,
-- with pg_catalog alone on the path of this file's transaction (also
-- when golang-migrate's CLI runs it). To see what a database had bound:
--
--   SELECT d.objid::regprocedure, pg_describe_object(d.refclassid, d.refobjid, 0)
--     FROM pg_depend AS d
--     JOIN pg_proc AS p ON d.classid = 'pg_proc'::regclass AND p.oid = d.objid
--    WHERE p.pronamespace = 'pgfence'::regnamespace
--      AND d.refclassid IN ('pg_proc'::regclass, 'pg_operator'::regclass)
--      AND pg_describe_object(d.refclassid, d.refobjid, 0) NOT LIKE '%pgfence.%';
BEGIN;

SET LOCAL search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION pgfence.lock_key(name text) RETURNS bigint
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN ('x' || encode(substring(sha256(convert_to(name, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint;

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
