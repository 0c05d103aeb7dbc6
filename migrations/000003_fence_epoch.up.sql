-- pgfence fence epochs: fences keep increasing across a failover, even to an
-- asynchronous standby that lost the tail of the primary's WAL.
--
-- The hazard. Every grant draws its fence from pgfence.fence_seq. When a
-- standby is promoted, grants the old primary acknowledged but had not yet
-- streamed are gone, fence values included: plain nextval on the new
-- primary hands out values an old holder may still carry. Two grants with
-- one fence defeat fencing.
--
-- The remedy. A promoted standby starts a new timeline, and PostgreSQL
-- records that in every WAL file name. pgfence.fence_epoch remembers the
-- server (system identifier) and timeline that last drew fences. Grants draw
-- through pgfence.next_fence(), which compares the server's current epoch
-- with the recorded one. When they differ -- a promotion, a PITR, a base
-- backup restored as a new primary, a dump restored into another cluster --
-- it first advances the sequence by a large gap and records the new epoch,
-- so every fence drawn on the new epoch exceeds every fence the lost WAL can
-- have handed out, as long as the lost tail held fewer than `gap` draws.
-- The gap is 2^32 per timeline moved (a promotion moves one): losing that
-- many grants would take 12 hours of replication lag at 100,000 grants a
-- second, while bigint leaves room for two billion failovers. After a
-- restore whose data may be older than that, run `pgfence fence bump --gap N`
-- (pgfence.bump_fence) with N above the grants made since the backup.
--
-- On a standby pg_current_wal_lsn() is refused, so next_fence() fails
-- loudly (SQLSTATE 25006) rather than hand out a fence nobody will honour.
BEGIN;

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

COMMIT;
