package fencing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestShareLockBlocksLeaseChanges: while a fenced transaction that has
// written is open, a takeover of its lease and a force-release wait for it
// (the fence lock), so neither can commit in the middle of the
// transaction; a renewal does not wait. Blocking is observed with
// pg_blocking_pids, not timing.
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
		{"force-release", `SELECT pgfence.force_release($1, 60000)`, []any{"job"}, false},
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

// TestRenewalDoesNotWaitForFencedWrites: the fence lock blocks takeovers
// only; the holder's keepalive renews while its fenced transaction is open.
func TestRenewalDoesNotWaitForFencedWrites(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	a := grant(t, pool, "job", time.Minute)
	tx, err := fencing.Begin(bg, pool, a)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(bg)
	if _, err := tx.Exec(bg, upsertItem, 1, "A"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, 30*time.Second) // far above a round trip; a wait would hit it
	defer cancel()
	var until *time.Time
	if err := pool.QueryRow(ctx, `SELECT pgfence.renew('job', 'owner-job', $1, 60000000)`, a.Fence).Scan(&until); err != nil || until == nil {
		t.Fatalf("renewal during an open fenced transaction: %v, %v", until, err)
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
}

// TestRepeatableReadSeesTakeover: a REPEATABLE READ transaction whose
// snapshot predates a force-release and takeover cannot write with the old
// token: its snapshot still shows the old grant as current, but the share
// lock on the lease row turns that into a serialization failure.
func TestRepeatableReadSeesTakeover(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	a := grant(t, pool, "job", time.Minute)
	tx := beginIso(t, pool, pgx.RepeatableRead)
	if _, err := tx.Exec(bg, `SELECT pgfence.declare_token($1, $2)`, a.Lease, a.Fence); err != nil {
		t.Fatal(err) // the snapshot is taken here
	}
	mustExec(t, pool, `SELECT pgfence.force_release('job')`)
	b := grant(t, pool, "job", time.Minute)
	_, err := tx.Exec(bg, upsertItem, 1, "A-stale")
	if err == nil {
		t.Fatalf("a REPEATABLE READ write with the old token succeeded after the takeover (new fence %d)", b.Fence)
	}
	if st := sqlState(err); st != "40001" && st != fencing.SQLStateStale {
		t.Fatalf("stale REPEATABLE READ write: %v, want a serialization failure or PF001", err)
	}
}

func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestRepeatableReadRenewedHolderIsNotStale (scenario: a holder's
// REPEATABLE READ transaction outlives the expiry its snapshot shows,
// while the keepalive renews the lease on another connection). The write
// must not get ErrStale — "you lost, stop", which the holder has not: its
// grant is live and nobody else holds the lease — but a serialization
// failure to retry; and the same token writes in the next transaction.
func TestRepeatableReadRenewedHolderIsNotStale(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "job", 2*time.Second)
	tx := beginIso(t, pool, pgx.RepeatableRead)
	var before time.Time
	if err := tx.QueryRow(bg, `SELECT expires_at FROM pgfence.leases WHERE name = $1`, tok.Lease).Scan(&before); err != nil {
		t.Fatal(err) // the snapshot is taken here
	}
	if _, err := tx.Exec(bg, `CALL pgfence.declare($1, $2)`, tok.Lease, tok.Fence); err != nil {
		t.Fatal(err)
	}
	// The keepalive renews the grant for a minute, on its own connection.
	var until *time.Time
	if err := pool.QueryRow(bg, `SELECT pgfence.renew($1, $2, $3, 60000000)`, tok.Lease, "owner-"+tok.Lease, tok.Fence).Scan(&until); err != nil || until == nil {
		t.Fatalf("renew: %v, %v", until, err)
	}
	pgtest.WaitFor(t, 10*time.Second, "the expiry the snapshot shows to pass", func() bool {
		var past bool
		err := pool.QueryRow(bg, `SELECT clock_timestamp() > $1`, before).Scan(&past)
		return err == nil && past
	})
	_, err := tx.Exec(bg, upsertItem, 1, "renewed holder")
	if err == nil || sqlState(err) != "40001" {
		t.Errorf("a REPEATABLE READ write by the renewed, current holder: %v; want a serialization failure (40001)", err)
	}
	_ = tx.Rollback(bg)
	if err := write(pool, tok, 1, "next transaction"); err != nil {
		t.Errorf("the same token in the next transaction: %v", err)
	}
}

// TestTruncateOutsideReadCommitted (scenario: a holder of lease a opens a
// REPEATABLE READ transaction; then b's holder commits a row with b's
// higher fence; then a's transaction truncates the table). TRUNCATE
// removes rows committed after the snapshot, which the guard's
// max(fence), read with the snapshot, never saw: it is refused outside
// READ COMMITTED, where the same TRUNCATE is checked against b's row and
// refused as stale.
func TestTruncateOutsideReadCommitted(t *testing.T) {
	t.Parallel()
	for _, iso := range []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable} {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			a := grant(t, pool, "a", time.Minute) // granted first: a lower fence
			b := grant(t, pool, "b", time.Minute)
			const id = 1
			tx := beginIso(t, pool, iso)
			if _, err := tx.Exec(bg, `CALL pgfence.declare($1, $2)`, a.Lease, a.Fence); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(bg, `SELECT count(*) FROM items`); err != nil {
				t.Fatal(err) // the snapshot, outside READ COMMITTED
			}
			if err := write(pool, b, id, "b's row"); err != nil {
				t.Fatal(err)
			}
			_, err := tx.Exec(bg, `TRUNCATE items`)
			if err == nil {
				err = tx.Commit(bg)
			}
			if _, _, ok := item(t, pool, id); !ok {
				t.Fatalf("TRUNCATE under fence %d removed b's row (fence %d) (err = %v)", a.Fence, b.Fence, err)
			}
			want := "0A000"
			if iso == pgx.ReadCommitted {
				want = fencing.SQLStateStale
			}
			if sqlState(err) != want {
				t.Errorf("TRUNCATE: %v, want SQLSTATE %s", err, want)
			}
		})
	}
}

// beginIso begins a transaction at isolation level iso on a connection of
// pool's own, rolled back (if still open) and released when t ends.
func beginIso(t *testing.T, pool *pgxpool.Pool, iso pgx.TxIsoLevel) pgx.Tx {
	t.Helper()
	conn, err := pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	tx, err := conn.BeginTx(bg, pgx.TxOptions{IsoLevel: iso})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(bg) })
	return tx
}
