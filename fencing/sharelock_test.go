package fencing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
)

// TestShareLockBlocksLeaseChanges: while a fenced transaction that has
// written is open, every change to its lease row waits for it — the takeover
// upsert the leases package grants with, a renewal or force-release
// (UPDATE), and a DELETE-based release — so none can commit in the middle of
// the transaction. Blocking is observed with pg_blocking_pids, not timing.
func TestShareLockBlocksLeaseChanges(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		sql  string
		args []any
		// expireFirst: wait until the lease has expired by the database
		// clock before trying (a takeover only applies to expired leases).
		expireFirst bool
	}{
		{"takeover", grantLease, []any{"job", "B", time.Minute.Microseconds()}, true},
		{"renew-or-force-release", `UPDATE pgfence.leases SET expires_at = clock_timestamp() WHERE name = $1`, []any{"job"}, false},
		{"delete-release", `DELETE FROM pgfence.leases WHERE name = $1`, []any{"job"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ttl := time.Minute
			if c.expireFirst {
				ttl = time.Second // long enough to write under -race, short to wait out
			}
			a := grant(t, pool, "job", ttl)
			tx, err := fencing.Begin(bg, pool, a)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(bg)
			if _, err := tx.Exec(bg, upsertItem, 1, "A"); err != nil {
				t.Fatalf("A's write: %v", err)
			}
			if c.expireFirst {
				waitFor(t, pool, `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = 'job'`)
			}

			other, err := pool.Acquire(bg)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Release()
			pid := other.Conn().PgConn().PID()
			done := make(chan error, 1)
			go func() {
				_, err := other.Exec(bg, c.sql, c.args...)
				done <- err
			}()
			waitFor(t, pool, `SELECT cardinality(pg_blocking_pids($1)) > 0`, pid)
			select {
			case err := <-done:
				t.Fatalf("%s completed (%v) while the fenced transaction was open", c.name, err)
			default:
			}
			if err := tx.Commit(bg); err != nil {
				t.Fatalf("A's commit: %v", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s after A committed: %v", c.name, err)
			}
			wantItem(t, pool, 1, "A", a.Fence)
		})
	}
}

// waitFor polls a boolean query until it is true. It polls a condition (the
// state of another backend), which no channel can signal; the deadline is
// generous because the machine may be loaded.
func waitFor(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	for {
		var ok bool
		err := pool.QueryRow(ctx, sql, args...).Scan(&ok)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatalf("%s: %v", sql, err)
		}
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", sql)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
