-- pgfence schema, version 1.
--
-- Applied by `pgfence migrate up`, migrations.Up, or the upstream migrate CLI
-- with x-migrations-table=pgfence_schema_migrations. Every object lives in
-- schema pgfence so that the down migration can remove exactly what this one
-- created. All times come from the database clock (clock_timestamp()).
BEGIN;

CREATE SCHEMA pgfence;

COMMENT ON SCHEMA pgfence IS 'pgfence: advisory-lock keys, leases with fences, and the fence guard for protected tables';

-- Every lease grant takes nextval: fences strictly increase across releases,
-- expiries, force-releases and restarts (sequences are WAL-logged).
CREATE SEQUENCE pgfence.fence_seq AS bigint MINVALUE 1 NO CYCLE;

CREATE TABLE pgfence.leases (
    name        text        PRIMARY KEY,
    owner       text        NOT NULL,
    fence       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    renewed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    metadata    jsonb,
    CONSTRAINT leases_name_length CHECK (octet_length(name) BETWEEN 1 AND 200),
    CONSTRAINT leases_owner_length CHECK (octet_length(owner) BETWEEN 1 AND 200),
    CONSTRAINT leases_fence_positive CHECK (fence > 0)
);

-- Serves "which leases have expired" (listing, cleanup, alerting).
CREATE INDEX leases_expires_at_idx ON pgfence.leases (expires_at);

-- lock_key maps a lock name to the bigint key of pg_advisory_lock: the first
-- 8 bytes of SHA-256 of the UTF-8 name, read big-endian as a signed int64.
-- Go's pglock.Key computes the same value, so an operator can contend with
-- the library from psql:  SELECT pg_advisory_lock(pgfence.lock_key('billing'));
CREATE FUNCTION pgfence.lock_key(name text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ('x' || encode(substring(sha256(convert_to(name, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint;

-- fence_guard is the trigger that pgfence.protect installs. A writer
-- declares its token for the transaction with
--     SELECT set_config('pgfence.fence', '<fence>', true),
--            set_config('pgfence.lease', '<lease name>', true);
-- (fencing.Begin / fencing.InTx do this). On INSERT, UPDATE and DELETE of a
-- protected row the guard
--   (a) rejects a write that declares no token (or a malformed one),
--   (b) rejects a token lower than the fence stored in the row,
--   (c) when the token names a lease, rejects it unless it is that lease's
--       current, unexpired fence (database clock), holding a share lock on
--       the lease row so that no takeover, renewal or release of that lease
--       can commit until this transaction ends,
--   (d) stores the token's fence in the row (INSERT, UPDATE).
-- On TRUNCATE (a statement trigger: row triggers do not fire) it applies
-- (a) and (c), and (b) against the highest fence in the table.
-- Rejections raise SQLSTATE PF001 (stale token) or PF002 (no token).
--
-- The common column name "fence" is read and written directly; any other
-- name goes through jsonb, which works for every table but costs more.
CREATE FUNCTION pgfence.fence_guard() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    col        text   := TG_ARGV[0];
    tok_text   text   := current_setting('pgfence.fence', true);
    tok_lease  text   := current_setting('pgfence.lease', true);
    tok        bigint;
    stored     bigint;
    current    bigint;
BEGIN
    IF tok_text IS NULL OR tok_text = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: write to %I.%I declares no fencing token', TG_TABLE_SCHEMA, TG_TABLE_NAME),
            HINT    = 'write through fencing.Begin or fencing.InTx, or SET LOCAL pgfence.fence (and pgfence.lease) first',
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;
    IF tok_text !~ '^[1-9][0-9]{0,18}$' OR length(tok_text) = 19 AND tok_text COLLATE "C" > '9223372036854775807' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF002',
            MESSAGE = format('pgfence: write to %I.%I declares a malformed fencing token %L', TG_TABLE_SCHEMA, TG_TABLE_NAME, tok_text),
            HINT    = 'pgfence.fence must be a positive bigint in decimal',
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;
    tok := tok_text::bigint;

    -- (c) The lease's current grant, share-locked until this transaction
    -- ends. A takeover (INSERT ... ON CONFLICT DO UPDATE), renewal (UPDATE)
    -- or release (UPDATE or DELETE) of the lease row needs a lock that
    -- conflicts with FOR SHARE, so it waits for this transaction; if one
    -- committed first, READ COMMITTED re-checks the new row version here
    -- and the stale token is rejected.
    IF tok_lease IS NOT NULL AND tok_lease <> '' THEN
        SELECT l.fence INTO current
          FROM pgfence.leases AS l
         WHERE l.name = tok_lease
           AND l.expires_at > clock_timestamp()
           FOR SHARE;
        IF NOT FOUND OR current IS DISTINCT FROM tok THEN
            RAISE EXCEPTION USING
                ERRCODE = 'PF001',
                MESSAGE = format('pgfence: stale fencing token: lease %L fence %s is not the current unexpired grant (current %s)',
                                 tok_lease, tok, coalesce(current::text, 'none')),
                TABLE   = TG_TABLE_NAME,
                SCHEMA  = TG_TABLE_SCHEMA;
        END IF;
    END IF;

    -- (b) Never go back below a fence already stored.
    IF TG_OP = 'TRUNCATE' THEN
        EXECUTE format('SELECT max(%I) FROM %I.%I', col, TG_TABLE_SCHEMA, TG_TABLE_NAME) INTO stored;
    ELSIF TG_OP IN ('UPDATE', 'DELETE') THEN
        IF col = 'fence' THEN
            stored := OLD.fence;
        ELSE
            stored := (to_jsonb(OLD) ->> col)::bigint;
        END IF;
    END IF;
    IF stored IS NOT NULL AND tok < stored THEN
        RAISE EXCEPTION USING
            ERRCODE = 'PF001',
            MESSAGE = format('pgfence: stale fencing token: fence %s is lower than the fence %s stored in %I.%I',
                             tok, stored, TG_TABLE_SCHEMA, TG_TABLE_NAME),
            TABLE   = TG_TABLE_NAME,
            SCHEMA  = TG_TABLE_SCHEMA;
    END IF;

    -- (d) Record the fence that wrote the row.
    IF TG_OP = 'TRUNCATE' THEN
        RETURN NULL;
    ELSIF TG_OP = 'DELETE' THEN
        RETURN OLD;
    ELSIF col = 'fence' THEN
        NEW.fence := tok;
    ELSE
        NEW := jsonb_populate_record(NEW, jsonb_build_object(col, tok));
    END IF;
    RETURN NEW;
END
$$;

-- protect installs fence_guard on an ordinary or partitioned table whose
-- fence column is bigint: a BEFORE row trigger for INSERT, UPDATE and DELETE
-- (pgfence_guard) and a BEFORE statement trigger for TRUNCATE
-- (pgfence_guard_truncate). Safe to repeat: it replaces both triggers.
-- On a partitioned table the row trigger is cloned to every partition,
-- present and future, but a statement trigger is not, and TRUNCATE of a
-- partition fires only the partition's own: so the TRUNCATE trigger is also
-- installed on every existing partition. Protect again after adding one.
CREATE FUNCTION pgfence.protect(tbl regclass, fence_column name DEFAULT 'fence') RETURNS void
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    kind "char";
    typ  oid;
    part regclass;
BEGIN
    SELECT c.relkind INTO kind FROM pg_class AS c WHERE c.oid = tbl;
    IF kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'wrong_object_type',
            MESSAGE = format('pgfence.protect: %s is not a table', tbl);
    END IF;
    SELECT a.atttypid INTO typ
      FROM pg_attribute AS a
     WHERE a.attrelid = tbl
       AND a.attname = fence_column
       AND a.attnum > 0
       AND NOT a.attisdropped;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'undefined_column',
            MESSAGE = format('pgfence.protect: table %s has no column %I', tbl, fence_column),
            HINT    = format('ALTER TABLE %s ADD COLUMN %I bigint NOT NULL DEFAULT 0', tbl, fence_column);
    END IF;
    IF typ <> 'bigint'::regtype THEN
        RAISE EXCEPTION USING
            ERRCODE = 'datatype_mismatch',
            MESSAGE = format('pgfence.protect: column %I of %s is %s, want bigint', fence_column, tbl, typ::regtype),
            HINT    = format('ALTER TABLE %s ALTER COLUMN %I TYPE bigint', tbl, fence_column);
    END IF;
    -- A partition of a protected table already has the row trigger, cloned
    -- from its parent (and it cannot be replaced there).
    IF NOT EXISTS (SELECT FROM pg_trigger AS t
                    WHERE t.tgrelid = tbl AND t.tgname = 'pgfence_guard' AND t.tgparentid <> 0) THEN
        EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard BEFORE INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION pgfence.fence_guard(%L)', tbl, fence_column);
    END IF;
    FOR part IN SELECT tbl UNION SELECT p.relid FROM pg_partition_tree(tbl) AS p LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence.fence_guard(%L)', part, fence_column);
    END LOOP;
END
$$;

COMMIT;
