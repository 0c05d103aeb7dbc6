-- Reverses 000006_once_semaphores.up.sql: drops the once table and the
-- functions of once per period, minimum hold and semaphores, and restores
-- migration 4's notify_waiters and grant_roles. Slot leases ('<sem>#<k>'
-- rows of pgfence.leases) stay, as ordinary leases.
BEGIN;

DROP FUNCTION pgfence.try_acquire_slot(text, integer, text, bigint);
DROP FUNCTION pgfence.release_at_least(text, text, bigint, bigint);
DROP FUNCTION pgfence.mark_done(text, text);
DROP TABLE pgfence.once;

CREATE OR REPLACE FUNCTION pgfence.notify_waiters(lease text) RETURNS void
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The exclusive try fails exactly when a waiter holds the key shared;
    -- when it succeeds it holds the key until commit, so a waiter that
    -- arrives meanwhile registers after this release and then sees it.
    IF NOT pg_try_advisory_xact_lock(1885824613, pgfence.wait_key(lease)) THEN
        PERFORM pg_notify('pgfence_leases', lease);
    END IF;
END
$$;

DROP FUNCTION pgfence.grant_roles();
ALTER FUNCTION pgfence.grant_roles_4() RENAME TO grant_roles;

COMMIT;
