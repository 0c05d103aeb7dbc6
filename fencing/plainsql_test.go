package fencing_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The plain-SQL alternatives documented for users who cannot install
// triggers, exactly as the package documentation shows them. They run on an
// unprotected table.
const (
	createAccounts = `CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL, fence bigint NOT NULL DEFAULT 0)`

	// guardedUpdate: $1 id, $2 new balance, $3 the token's fence. Zero
	// rows: stale (or no such row).
	guardedUpdate = `
UPDATE accounts SET balance = $2, fence = $3
 WHERE id = $1 AND fence <= $3`

	// leaseGuardedUpdate adds rule (c): $4 the lease name. The CTE's FOR
	// SHARE holds the lease row until the transaction ends.
	leaseGuardedUpdate = `
WITH lease AS (
    SELECT 1 FROM pgfence.leases
     WHERE name = $4 AND fence = $3 AND expires_at > clock_timestamp()
       FOR SHARE
)
UPDATE accounts SET balance = $2, fence = $3
 WHERE id = $1 AND fence <= $3 AND EXISTS (SELECT FROM lease)`
)

func plainSetup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := setup(t)
	mustExec(t, pool, createAccounts)
	mustExec(t, pool, `INSERT INTO accounts (id, balance) VALUES (1, 100)`)
	return pool
}

func rowsAffected(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	tag, err := pool.Exec(bg, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

func wantBalance(t *testing.T, pool *pgxpool.Pool, balance, fence int64) {
	t.Helper()
	var b, f int64
	if err := pool.QueryRow(bg, `SELECT balance, fence FROM accounts WHERE id = 1`).Scan(&b, &f); err != nil {
		t.Fatal(err)
	}
	if b != balance || f != fence {
		t.Fatalf("account = (balance %d, fence %d), want (%d, %d)", b, f, balance, fence)
	}
}

// TestGuardedUpdate: the row comparison alone rejects a stale holder once a
// newer one has written — but not before: that gap is what rule (c) closes.
func TestGuardedUpdate(t *testing.T) {
	t.Parallel()
	pool := plainSetup(t)
	a := grant(t, pool, "job", time.Minute)
	if n := rowsAffected(t, pool, guardedUpdate, 1, 110, a.Fence); n != 1 {
		t.Fatalf("A's guarded update affected %d rows, want 1", n)
	}
	expire(t, pool, "job")
	b := grant(t, pool, "job", time.Minute)
	// A before B writes: the fence comparison cannot tell.
	if n := rowsAffected(t, pool, guardedUpdate, 1, 120, a.Fence); n != 1 {
		t.Fatalf("A's guarded update before B wrote affected %d rows; the documented gap is gone, update the docs", n)
	}
	if n := rowsAffected(t, pool, guardedUpdate, 1, 200, b.Fence); n != 1 {
		t.Fatalf("B's guarded update affected %d rows, want 1", n)
	}
	// A after B wrote: zero rows.
	if n := rowsAffected(t, pool, guardedUpdate, 1, 130, a.Fence); n != 0 {
		t.Fatalf("A's stale guarded update affected %d rows, want 0", n)
	}
	wantBalance(t, pool, 200, b.Fence)
}

// TestLeaseGuardedUpdate: with the lease check in the statement, a stale
// holder is rejected before and after its successor writes, and the share
// lock holds off a release until the writing transaction ends.
func TestLeaseGuardedUpdate(t *testing.T) {
	t.Parallel()
	pool := plainSetup(t)
	a := grant(t, pool, "job", time.Minute)
	if n := rowsAffected(t, pool, leaseGuardedUpdate, 1, 110, a.Fence, a.Lease); n != 1 {
		t.Fatalf("A's update affected %d rows, want 1", n)
	}

	// The share lock: a DELETE of the lease row waits for A's transaction.
	tx, err := pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(bg)
	if tag, err := tx.Exec(bg, leaseGuardedUpdate, 1, 111, a.Fence, a.Lease); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("A's update in a transaction: %v, %v", tag, err)
	}
	other, err := pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	done := make(chan error, 1)
	go func() {
		_, err := other.Exec(bg, `UPDATE pgfence.leases SET expires_at = clock_timestamp() WHERE name = $1`, a.Lease)
		done <- err
	}()
	waitFor(t, pool, `SELECT cardinality(pg_blocking_pids($1)) > 0`, other.Conn().PgConn().PID())
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// A's lease has now expired; B takes over.
	b := grant(t, pool, "job", time.Minute)
	if n := rowsAffected(t, pool, leaseGuardedUpdate, 1, 120, a.Fence, a.Lease); n != 0 {
		t.Fatalf("A's update before B wrote affected %d rows, want 0", n)
	}
	if n := rowsAffected(t, pool, leaseGuardedUpdate, 1, 200, b.Fence, b.Lease); n != 1 {
		t.Fatalf("B's update affected %d rows, want 1", n)
	}
	if n := rowsAffected(t, pool, leaseGuardedUpdate, 1, 130, a.Fence, a.Lease); n != 0 {
		t.Fatalf("A's update after B wrote affected %d rows, want 0", n)
	}
	wantBalance(t, pool, 200, b.Fence)
}
