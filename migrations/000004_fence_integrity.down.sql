-- Reverses 000004_fence_integrity.up.sql: back to migration 3's sequence
-- and epochs, its guard (which reads pgfence.fence and pgfence.lease) and
-- its privileges. The sequence restarts above every fence issued so far, so
-- fences keep increasing. The roles are dropped unless another database
-- still grants them something (they are cluster-wide).
BEGIN;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT tg.tgrelid::regclass AS tbl, tg.tgargs
          FROM pg_trigger AS tg
         WHERE tg.tgname = 'pgfence_guard_truncate'
           AND tg.tgfoid = 'pgfence.fence_guard_truncate()'::regprocedure
    LOOP
        EXECUTE format('CREATE OR REPLACE TRIGGER pgfence_guard_truncate BEFORE TRUNCATE ON %s '
                       'FOR EACH STATEMENT EXECUTE FUNCTION pgfence.fence_guard(%L)', t.tbl,
                       convert_from(substring(t.tgargs FROM 1 FOR position(decode('00', 'hex') IN t.tgargs) - 1), 'UTF8'));
    END LOOP;
END
$$;

REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM PUBLIC;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_client') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM pgfence_client;
        REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM pgfence_client;
        REVOKE ALL ON SCHEMA pgfence FROM pgfence_client;
    END IF;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pgfence_operator') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA pgfence FROM pgfence_operator;
        REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgfence FROM pgfence_operator;
        REVOKE ALL ON SCHEMA pgfence FROM pgfence_operator;
    END IF;
END
$$;

DROP FUNCTION pgfence.grant_roles();
DROP FUNCTION pgfence.unguarded();
DROP FUNCTION pgfence.fence_guard_truncate();
DROP FUNCTION pgfence.token_fence(regclass);
DROP FUNCTION pgfence.declare_token(text, bigint);
DROP FUNCTION pgfence.bump_fence(bigint);
DROP FUNCTION pgfence.force_release(text, integer);
DROP FUNCTION pgfence.release_many(text[], text[], bigint[]);
DROP FUNCTION pgfence.release(text, text, bigint);
DROP FUNCTION pgfence.renew_many(text[], text[], bigint[], bigint[]);
DROP FUNCTION pgfence.renew(text, text, bigint, bigint);
DROP FUNCTION pgfence.try_acquire(text, text, bigint);
DROP FUNCTION pgfence.notify_waiters(text);
DROP FUNCTION pgfence.wait_key(text);

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
CREATE OR REPLACE FUNCTION pgfence.fence_guard() RETURNS trigger
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
CREATE OR REPLACE FUNCTION pgfence.protect(tbl regclass, fence_column name DEFAULT 'fence') RETURNS void
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

CREATE SEQUENCE pgfence.fence_seq AS bigint MINVALUE 1 NO CYCLE;
SELECT setval('pgfence.fence_seq',
              greatest(f.floor, coalesce((SELECT max(l.fence) FROM pgfence.leases AS l), 0), 1))
  FROM pgfence.fence_floor AS f;
DROP TABLE pgfence.fence_floor;
CREATE INDEX leases_expires_at_idx ON pgfence.leases (expires_at);
ALTER TABLE pgfence.leases RESET (fillfactor);

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgfence TO PUBLIC;

-- One row: the epoch that last drew fences.
CREATE TABLE pgfence.fence_epoch (
    singleton         boolean     PRIMARY KEY DEFAULT true,
    system_identifier bigint      NOT NULL,
    timeline          bigint      NOT NULL,
    bumped_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT fence_epoch_one_row CHECK (singleton)
);

COMMENT ON TABLE pgfence.fence_epoch IS 'pgfence: the server (system identifier) and timeline on which fences were last drawn; pgfence.next_fence() skips ahead when they change';

-- server_epoch is this server's (system identifier, WAL insert timeline),
-- and fails on a standby: fences are drawn on the primary only. The
-- timeline is the first 8 hex digits of the current WAL file's name; it
-- follows a promotion at once, in new and existing sessions alike.
CREATE FUNCTION pgfence.server_epoch(OUT system_identifier bigint, OUT timeline bigint)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'read_only_sql_transaction',
            MESSAGE = 'pgfence: this server is a standby (in recovery): fences and leases are granted only by the primary',
            HINT    = 'connect to the primary, e.g. with a multi-host connection string and target_session_attrs=read-write';
    END IF;
    SELECT c.system_identifier INTO system_identifier FROM pg_control_system() AS c;
    timeline := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint;
END
$$;

INSERT INTO pgfence.fence_epoch (system_identifier, timeline)
SELECT e.system_identifier, e.timeline FROM pgfence.server_epoch() AS e;

-- advance_epoch moves the sequence on by gap x steps (steps: the number of
-- timelines moved since the recorded epoch, at least 1) and records the
-- server's epoch, under the epoch row's lock so concurrent callers advance
-- once. With force false it does nothing if the epoch is already current
-- (another session advanced it while this one waited for the lock).
-- Returns the sequence's value afterwards: every later fence exceeds it.
--
-- setval is not transactional: if the calling transaction rolls back, the
-- sequence stays advanced while the epoch is not recorded, and the next
-- call advances again. That wastes fence values, never reuses them.
CREATE FUNCTION pgfence.advance_epoch(gap bigint, force boolean) RETURNS bigint
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur    record;
    rec    record;
    steps  bigint := 1;
    last   bigint;
    target numeric;
BEGIN
    IF gap IS NULL OR gap < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('pgfence: the fence gap must be a positive bigint, got %s', coalesce(gap::text, 'NULL'));
    END IF;
    SELECT * INTO cur FROM pgfence.server_epoch();
    SELECT e.system_identifier, e.timeline INTO rec FROM pgfence.fence_epoch AS e FOR UPDATE;
    IF FOUND AND NOT force AND rec.system_identifier = cur.system_identifier AND rec.timeline = cur.timeline THEN
        SELECT s.last_value INTO last FROM pgfence.fence_seq AS s;
        RETURN last;
    END IF;
    IF FOUND AND rec.system_identifier = cur.system_identifier AND cur.timeline > rec.timeline THEN
        -- Timelines skipped on the way (a standby promoted in between whose
        -- own advance this server never received) each get a gap too.
        steps := cur.timeline - rec.timeline;
    END IF;
    SELECT s.last_value INTO last FROM pgfence.fence_seq AS s;
    target := last::numeric + gap::numeric * steps;
    IF target > 9223372036854775807 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'sequence_generator_limit_exceeded',
            MESSAGE = format('pgfence: advancing fences by %s x %s from %s would exceed bigint', gap, steps, last);
    END IF;
    PERFORM setval('pgfence.fence_seq', target::bigint, true);
    INSERT INTO pgfence.fence_epoch AS e (singleton, system_identifier, timeline, bumped_at)
    VALUES (true, cur.system_identifier, cur.timeline, clock_timestamp())
    ON CONFLICT (singleton) DO UPDATE
       SET system_identifier = EXCLUDED.system_identifier,
           timeline          = EXCLUDED.timeline,
           bumped_at         = EXCLUDED.bumped_at;
    RETURN target::bigint;
END
$$;

-- next_fence is the fence of a new grant: nextval of pgfence.fence_seq,
-- after advancing past a changed epoch. The common case costs one read of
-- the one-row epoch table and of pg_control. SECURITY DEFINER (owned by the
-- role that ran the migration) so that an application role needs no
-- privilege beyond USAGE on schema pgfence; search_path is pinned.
CREATE FUNCTION pgfence.next_fence() RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cur record;
BEGIN
    SELECT * INTO cur FROM pgfence.server_epoch();
    PERFORM FROM pgfence.fence_epoch AS e
      WHERE e.system_identifier = cur.system_identifier AND e.timeline = cur.timeline;
    IF NOT FOUND THEN
        PERFORM pgfence.advance_epoch(4294967296, false);
    END IF;
    RETURN nextval('pgfence.fence_seq');
END
$$;

-- bump_fence is the operator's manual step (`pgfence fence bump`): advance
-- fences by gap now and record the server's epoch, e.g. after restoring a
-- backup older than the default gap covers. Returns the sequence's value
-- afterwards: every later fence exceeds it. Not for application roles:
-- EXECUTE is revoked from PUBLIC (a huge gap would exhaust the sequence);
-- the migrating role may GRANT it to an operator role.
CREATE FUNCTION pgfence.bump_fence(gap bigint DEFAULT 4294967296) RETURNS bigint
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN pgfence.advance_epoch(gap, true);
END
$$;

REVOKE EXECUTE ON FUNCTION pgfence.server_epoch() FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgfence.advance_epoch(bigint, boolean) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgfence.bump_fence(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgfence.next_fence() TO PUBLIC;

DO $$
BEGIN
    DROP ROLE IF EXISTS pgfence_operator;
    DROP ROLE IF EXISTS pgfence_client;
EXCEPTION
    WHEN dependent_objects_still_exist OR insufficient_privilege THEN
        RAISE NOTICE 'pgfence: roles pgfence_client and pgfence_operator kept: %', SQLERRM;
END
$$;

COMMIT;
