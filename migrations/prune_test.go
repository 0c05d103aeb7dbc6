package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// grant takes lease name with ttl through pgfence.try_acquire and returns
// its fence.
func grant(t *testing.T, ctx context.Context, conn *pgx.Conn, name string, ttl time.Duration) int64 {
	t.Helper()
	var fence int64
	err := conn.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire($1, 'owner', $2, NULL) WHERE granted`, name, ttl.Microseconds()).Scan(&fence)
	if err != nil {
		t.Fatalf("grant %q: %v", name, err)
	}
	return fence
}

// expire moves lease name's expiry ago into the past.
func expire(t *testing.T, ctx context.Context, conn *pgx.Conn, name string, ago time.Duration) {
	t.Helper()
	_, err := conn.Exec(ctx, `UPDATE pgfence.leases SET expires_at = clock_timestamp() - $2 * interval '1 microsecond' WHERE name = $1`,
		name, ago.Microseconds())
	if err != nil {
		t.Fatalf("expire %q: %v", name, err)
	}
}

// prune runs pgfence.prune and returns how many rows it deleted.
func prune(t *testing.T, ctx context.Context, conn *pgx.Conn, olderThan time.Duration, maxRows int) int64 {
	t.Helper()
	var n int64
	if err := conn.QueryRow(ctx, `SELECT pgfence.prune($1, $2)`, olderThan.Microseconds(), maxRows).Scan(&n); err != nil {
		t.Fatalf("prune(%s, %d): %v", olderThan, maxRows, err)
	}
	return n
}

// leaseNames lists the rows of pgfence.leases.
func leaseNames(t *testing.T, ctx context.Context, conn *pgx.Conn) []string {
	t.Helper()
	rows, _ := conn.Query(ctx, `SELECT name FROM pgfence.leases ORDER BY name`)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// farFence is a fence far above any drawn from the clock: only the fence
// floor that prune raises can give a later grant a higher one.
const farFence = int64(1) << 60

// setFence sets lease name's stored fence, as a grant far in the clock's
// future (after a fence bump) would have.
func setFence(t *testing.T, ctx context.Context, conn *pgx.Conn, name string, fence int64) {
	t.Helper()
	if _, err := conn.Exec(ctx, `UPDATE pgfence.leases SET fence = $2 WHERE name = $1`, name, fence); err != nil {
		t.Fatalf("set the fence of %q: %v", name, err)
	}
}

// beginPrune runs prune(0) in a transaction of its own on u that it leaves
// open, wanting one row deleted; the transaction is rolled back when t
// ends unless committed.
func beginPrune(t *testing.T, ctx context.Context, u string) pgx.Tx {
	t.Helper()
	tx, err := connect(t, u).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	var n int64
	if err := tx.QueryRow(ctx, `SELECT pgfence.prune(0)`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("prune = %d, %v; want 1 row", n, err)
	}
	return tx
}

// grantInBackground runs query, a grant returning its fence, on a
// connection of its own to u, and sends the fence when it returns.
func grantInBackground(t *testing.T, ctx context.Context, u, query string) <-chan int64 {
	t.Helper()
	conn := connect(t, u)
	took := make(chan int64, 1)
	go func() {
		var f int64
		if err := conn.QueryRow(ctx, query).Scan(&f); err != nil {
			t.Errorf("%s: %v", query, err)
		}
		took <- f
	}()
	return took
}

// waitForLockWait waits until a backend of this database whose query is
// LIKE like waits for a lock.
func waitForLockWait(t *testing.T, ctx context.Context, conn *pgx.Conn, what, like string) {
	t.Helper()
	pgtest.WaitFor(t, 30*time.Second, what, func() bool {
		var ok bool
		err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
  WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1)`, like).Scan(&ok)
		return err == nil && ok
	})
}

// TestPrune: prune deletes the rows expired before the cutoff, not live
// ones nor ones expired since, at most max_rows a call, and a deleted
// name's next grant still gets a higher fence than it had — here a fence
// far above the clock, which only the raised fence floor can exceed.
func TestPrune(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(t, pgtest.URL(t))
	for _, name := range []string{"old1", "old2", "old3", "recent", "live"} {
		grant(t, ctx, conn, name, time.Hour)
	}
	for _, name := range []string{"old1", "old2", "old3"} {
		expire(t, ctx, conn, name, 2*time.Hour)
	}
	expire(t, ctx, conn, "recent", time.Minute)
	setFence(t, ctx, conn, "old2", farFence)

	if n := prune(t, ctx, conn, time.Hour, 2); n != 2 {
		t.Errorf("prune(1h, at most 2) deleted %d rows, want 2", n)
	}
	if n := prune(t, ctx, conn, time.Hour, 2); n != 1 {
		t.Errorf("prune(1h, at most 2) again deleted %d rows, want the third", n)
	}
	if got := leaseNames(t, ctx, conn); len(got) != 2 || got[0] != "live" || got[1] != "recent" {
		t.Fatalf("rows left by prune(1h) = %v, want [live recent]", got)
	}
	var floor int64
	if err := conn.QueryRow(ctx, `SELECT floor FROM pgfence.fence_floor`).Scan(&floor); err != nil {
		t.Fatal(err)
	}
	if floor < farFence {
		t.Errorf("fence floor after prune = %d, want at least the deleted fence %d", floor, farFence)
	}
	if f := grant(t, ctx, conn, "old2", time.Hour); f <= farFence {
		t.Errorf("fence of the pruned name's next grant = %d, want above its deleted fence %d", f, farFence)
	}
	if n := prune(t, ctx, conn, 0, 100); n != 1 {
		t.Errorf("prune(0) deleted %d rows, want 1 (recent)", n)
	}
	for _, q := range []string{`SELECT pgfence.prune(-1)`, `SELECT pgfence.prune(NULL)`, `SELECT pgfence.prune(0, 0)`} {
		if _, err := conn.Exec(ctx, q); sqlstateOf(err) != "22023" {
			t.Errorf("%s: %v, want invalid_parameter_value (22023)", q, err)
		}
	}
}

// TestPruneLeavesFencedTransactions (scenario: a lease expired while its
// holder's fenced transaction stays open, and an operator prunes). prune
// leaves that row until the transaction ends; and it takes no live
// lease's fence lock, which would stall that lease's fenced writes until
// prune's transaction ended.
func TestPruneLeavesFencedTransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	admin := connect(t, u)
	if _, err := admin.Exec(ctx, `CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0); SELECT pgfence.protect('work')`); err != nil {
		t.Fatal(err)
	}
	expired := grant(t, ctx, admin, "expired", time.Hour)
	live := grant(t, ctx, admin, "live", time.Hour)

	holder := connect(t, u)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `CALL pgfence.declare('expired', $1)`, expired); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO work VALUES (1)`); err != nil {
		t.Fatalf("fenced write: %v", err)
	}
	expire(t, ctx, admin, "expired", 2*time.Hour)

	pruner := connect(t, u)
	ptx, err := pruner.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ptx.Rollback(ctx) }()
	var n int64
	if err := ptx.QueryRow(ctx, `SELECT pgfence.prune(0)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("prune under an open fenced transaction deleted %d rows, want 0", n)
	}
	// prune's transaction is still open: a fenced write under the live
	// lease must not wait for it.
	writer := connect(t, u)
	err = pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CALL pgfence.declare('live', $1)`, live); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO work VALUES (2)`)
		return err
	})
	if err != nil {
		t.Fatalf("fenced write under a live lease while prune's transaction is open: %v", err)
	}
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit of the expired holder's fenced transaction: %v", err)
	}
	if n := prune(t, ctx, admin, 0, 100); n != 1 {
		t.Errorf("prune after the fenced transaction ended deleted %d rows, want 1", n)
	}
}

// TestPruneRoles: prune is an operator's; an application role
// (pgfence_client) may not delete lease rows.
func TestPruneRoles(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	_, clientURL := newRole(t, u, `GRANT pgfence_client TO {role}`)
	client := connect(t, clientURL)
	if _, err := client.Exec(ctx, `SELECT pgfence.prune(0)`); sqlstateOf(err) != "42501" {
		t.Errorf("prune as a pgfence_client: %v, want insufficient_privilege (42501)", err)
	}
	_, operatorURL := newRole(t, u, `GRANT pgfence_operator TO {role}`)
	operator := connect(t, operatorURL)
	if _, err := operator.Exec(ctx, `SELECT pgfence.prune(0)`); err != nil {
		t.Errorf("prune as a pgfence_operator: %v", err)
	}
}

// TestPruneRacingGrant (scenario: a grant of a name arrives while prune is
// deleting its row). The grant waits for prune's transaction and then
// gets a fence above the deleted one — far above the clock here, so only
// the fence floor prune raised in the same transaction can give it that.
func TestPruneRacingGrant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	admin := connect(t, u)
	grant(t, ctx, admin, "x", time.Hour)
	expire(t, ctx, admin, "x", time.Minute)
	setFence(t, ctx, admin, "x", farFence)
	ptx := beginPrune(t, ctx, u)
	took := grantInBackground(t, ctx, u, `SELECT fence FROM pgfence.try_acquire('x', 'taker', 60000000, NULL) WHERE granted`)
	waitForLockWait(t, ctx, admin, "the grant to wait for prune's transaction", "%try_acquire%")
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if f := <-took; f <= farFence {
		t.Errorf("fence of the grant that raced prune = %d, want above the deleted fence %d", f, farFence)
	}
}

// TestPruneRacingSlotGrant (scenario: a semaphore slot's row is pruned
// while a replica asks for a slot). try_acquire_slot read the fence floor
// when it began and inserted a pruned slot's new row with that value:
// where prune committed in between, the new grant's fence could be below
// the deleted one (when that was above the clock: after a fence bump).
// The interleaving is forced: an ACCESS EXCLUSIVE lock request queued
// behind prune makes the slot grant wait after it has begun and before it
// reads the lease table, until prune has committed.
func TestPruneRacingSlotGrant(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	admin := connect(t, u)
	if _, err := admin.Exec(ctx, `SELECT FROM pgfence.try_acquire_slot('sem', 1, 'first', 60000000)`); err != nil {
		t.Fatal(err)
	}
	expire(t, ctx, admin, "sem#1", time.Minute)
	setFence(t, ctx, admin, "sem#1", farFence)
	ptx := beginPrune(t, ctx, u)
	locker := connect(t, u)
	locked := make(chan error, 1)
	go func() {
		_, err := locker.Exec(ctx, `BEGIN; LOCK TABLE pgfence.leases IN ACCESS EXCLUSIVE MODE; COMMIT`)
		locked <- err
	}()
	waitForLockWait(t, ctx, admin, "the table lock to queue behind prune", "BEGIN; LOCK TABLE%")
	took := grantInBackground(t, ctx, u, `SELECT fence FROM pgfence.try_acquire_slot('sem', 1, 'taker', 60000000) WHERE granted`)
	waitForLockWait(t, ctx, admin, "the slot grant to queue behind the table lock", "%try_acquire_slot%")
	if err := ptx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	if f := <-took; f <= farFence {
		t.Errorf("fence of the slot grant that raced prune = %d, want above the deleted fence %d", f, farFence)
	}
}
