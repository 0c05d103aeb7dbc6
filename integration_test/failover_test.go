package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pglock"
)

// The failover tests run a primary and a streaming hot standby of their own
// (internal/pgcluster), kill the primary as a machine crash would, promote
// the standby, and check what pgfence's clients see through a multi-host
// connection string with target_session_attrs=read-write.

const (
	// standbyName is the standby's application_name, as listed in the
	// primary's synchronous_standby_names.
	standbyName = "pgfence_standby"
	// sqlstateReadOnly is read_only_sql_transaction: a write, or a fence,
	// asked of a standby.
	sqlstateReadOnly = "25006"
)

// haPair is a primary and its streaming standby, both migrated.
type haPair struct {
	primary, standby *pgtest.Cluster
	// walProxy is between the standby's walreceiver and the primary (nil
	// unless asked for), so that a test can stop replication silently.
	walProxy *proxy
}

// startPair starts a primary, applies pgfence's migrations, and makes a
// standby of it. With sync, the primary waits for the standby's flush
// before acknowledging a commit (synchronous_standby_names = 'ANY 1
// (pgfence_standby)', synchronous_commit on); otherwise replication is
// asynchronous. With proxied, the walreceiver connects through walProxy.
// It returns once the standby has replayed everything the primary wrote.
func startPair(t *testing.T, sync, proxied bool) *haPair {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	p := &haPair{primary: pgtest.StartCluster(t)}
	if err := migrations.Up(ctx, p.primary.URL("postgres")); err != nil {
		t.Fatalf("migrate the primary: %v", err)
	}
	opts := []pgcluster.StandbyOption{pgcluster.WithStandbyName(standbyName)}
	if proxied {
		p.walProxy = startProxy(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(p.primary.Port())))
		opts = append(opts, pgcluster.WithUpstream(p.walProxy.Addr()))
	}
	standby, err := p.primary.NewStandby(opts...)
	if err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	t.Cleanup(func() {
		if err := standby.Close(); err != nil {
			t.Errorf("remove the standby: %v", err)
		}
	})
	p.standby = standby

	admin := haConn(t, p.primary.URL("postgres"))
	if sync {
		for _, q := range []string{
			`ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (` + standbyName + `)'`,
			`SELECT pg_reload_conf()`,
		} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		mustWait(t, 30*time.Second, "the standby to become synchronous", func() (bool, error) {
			var state string
			err := admin.QueryRow(ctx, `SELECT sync_state FROM pg_stat_replication WHERE application_name = $1`, standbyName).Scan(&state)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			return state == "quorum", err
		})
	}
	p.waitCaughtUp(t)
	return p
}

// waitCaughtUp waits until the standby has replayed the primary's WAL up to
// the primary's current insert position.
func (p *haPair) waitCaughtUp(t *testing.T) {
	t.Helper()
	waitReplayed(t, p.primary, p.standby)
}

// url is a multi-host connection string over both servers that connects
// only to the one that accepts writes: the primary, then after promotion
// the former standby.
func (p *haPair) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=3",
		p.primary.Port(), p.standby.Port())
}

// failover kills the primary (SIGKILL to every server process) and promotes
// the standby, returning how long that took.
func (p *haPair) failover(t *testing.T) time.Duration {
	t.Helper()
	start := time.Now()
	if err := p.primary.Kill(); err != nil {
		t.Fatalf("kill the primary: %v", err)
	}
	if err := p.standby.Promote(ctxT(t, time.Minute)); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	return time.Since(start)
}

// haConn opens one connection, closed at the end of the test.
func haConn(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect to %s: %v", u, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// sqlstateOf is the SQLSTATE of err, or "" when err is not from PostgreSQL.
func sqlstateOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// renewOnNewPrimary renews l until a renewal succeeds (the client has
// reconnected, through the multi-host URL, to the promoted server and found
// its grant) and fails t if the lease is lost instead.
func renewOnNewPrimary(t *testing.T, l *leases.Lease) {
	t.Helper()
	var lost error
	mustWait(t, 20*time.Second, "lease "+l.Name()+" to renew on the new primary", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := l.Renew(ctx)
		if errors.Is(err, leases.ErrLost) {
			lost = err
			return true, nil
		}
		return err == nil, err
	})
	if lost != nil {
		t.Fatalf("lease %s was lost across a failover that kept its row: %v", l.Name(), lost)
	}
}

// TestFailoverSync: with synchronous replication, a failover loses no
// acknowledged grant. Every fence granted after it exceeds every fence
// granted before; a lease holder reconnects through the multi-host URL and
// keeps its lease; an advisory-lock holder is told its lock is gone; and a
// holder whose lease was taken over after the failover cannot write.
// Before the failover it also checks what a client connected to the
// standby gets: leases fail loudly (SQLSTATE 25006), while an advisory
// lock there is granted and excludes nobody on the primary.
func TestFailoverSync(t *testing.T) {
	t.Parallel()
	p := startPair(t, true, false)
	ctx := ctxT(t, 2*time.Minute)
	const ttl = 20 * time.Second

	poolA := newPool(t, p.url(), "failover-a")
	a := newLeases(t, poolA, "a")
	protectedTable(t, poolA, "failover_items", "id int PRIMARY KEY, holder text NOT NULL")

	var before []int64
	kept, err := a.TryAcquire(ctx, "failover/kept", ttl)
	if err != nil {
		t.Fatal(err)
	}
	stale, err := a.TryAcquire(ctx, "failover/stale", ttl)
	if err != nil {
		t.Fatal(err)
	}
	before = append(before, kept.Fence(), stale.Fence())
	for range 5 {
		l, err := a.TryAcquire(ctx, "failover/churn", ttl)
		if err != nil {
			t.Fatal(err)
		}
		before = append(before, l.Fence())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := fencing.InTx(ctx, poolA, stale.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO failover_items (id, holder) VALUES (1, 'a')`)
		return err
	}); err != nil {
		t.Fatalf("fenced write before the failover: %v", err)
	}
	locker := newLocker(t, poolA, pglock.WithLivenessCheck(200*time.Millisecond, time.Second))
	lk, err := locker.TryLock(ctx, "failover/lock")
	if err != nil {
		t.Fatal(err)
	}

	// A client pointed at the standby itself.
	standbyPool := newPool(t, p.standby.URL("postgres"), "failover-standby")
	sc := newLeases(t, standbyPool, "standby")
	if l, err := sc.TryAcquire(ctx, "failover/on-standby", ttl); sqlstateOf(err) != sqlstateReadOnly {
		t.Errorf("TryAcquire on a standby = %v, %v; want an error with SQLSTATE %s", l, err, sqlstateReadOnly)
	} else {
		t.Logf("TryAcquire on the standby: %v", err)
	}
	standbyConn := haConn(t, p.standby.URL("postgres"))
	if _, err := standbyConn.Exec(ctx, `SELECT * FROM pgfence.try_acquire('failover/raw', 'raw', 60000000)`); sqlstateOf(err) != sqlstateReadOnly {
		t.Errorf("pgfence.try_acquire on a standby = %v; want SQLSTATE %s", err, sqlstateReadOnly)
	}
	// pglock refuses a standby: every acquiring call fails with ErrStandby
	// and takes nothing, in both scopes. Each is refused at once; the
	// deadline (generous for a loaded machine) turns a lock granted there
	// and then awaited into a failure rather than a hang.
	refuseCtx, cancelRefuse := context.WithTimeout(ctx, 10*time.Second)
	defer cancelRefuse()
	// refused gives back a Lock granted by mistake, so that its pinned
	// connection does not keep the pool from closing, and returns err.
	refused := func(lk *pglock.Lock, err error) error {
		if lk != nil {
			_ = lk.Unlock(context.Background())
		}
		return err
	}
	standbyLocker := newLocker(t, standbyPool)
	for op, try := range map[string]func() error{
		"Lock":     func() error { return refused(standbyLocker.Lock(refuseCtx, "failover/lock")) },
		"TryLock":  func() error { return refused(standbyLocker.TryLock(refuseCtx, "failover/lock")) },
		"RLock":    func() error { return refused(standbyLocker.RLock(refuseCtx, "failover/lock")) },
		"TryRLock": func() error { return refused(standbyLocker.TryRLock(refuseCtx, "failover/lock")) },
		"XactLock": func() error {
			return pgx.BeginFunc(refuseCtx, standbyPool, func(tx pgx.Tx) error { return pglock.XactLock(refuseCtx, tx, "failover/lock") })
		},
		"TryXactLock": func() error {
			return pgx.BeginFunc(refuseCtx, standbyPool, func(tx pgx.Tx) error {
				_, err := pglock.TryXactLock(refuseCtx, tx, "failover/lock")
				return err
			})
		},
	} {
		if err := try(); !errors.Is(err, pglock.ErrStandby) {
			t.Errorf("pglock %s on a standby = %v, want ErrStandby", op, err)
		}
	}
	// A standby's session is never proven (pglock/proven.go): on one
	// connection, a second try is refused like the first.
	oneConn := newPool(t, p.standby.URL("postgres"), "failover-standby-one", func(c *pgxpool.Config) { c.MaxConns = 1 })
	oneLocker := newLocker(t, oneConn)
	for i := range 2 {
		if err := refused(oneLocker.TryLock(refuseCtx, "failover/lock")); !errors.Is(err, pglock.ErrStandby) {
			t.Errorf("pglock TryLock %d on one standby connection = %v, want ErrStandby", i+1, err)
		}
	}
	var standbyLocks int
	if err := standbyPool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&standbyLocks); err != nil || standbyLocks != 0 {
		t.Errorf("advisory locks on the standby after pglock refused = %d, %v; want 0", standbyLocks, err)
	}
	// Raw SQL shows why: advisory locks are local to each server, and the
	// standby grants a lock the primary's holder has.
	var got bool
	if err := standbyConn.QueryRow(ctx, `SELECT pg_try_advisory_lock(pgfence.lock_key('failover/lock'))`).Scan(&got); err != nil || !got {
		t.Errorf("pg_try_advisory_lock on the standby while the primary's session holds it = %v, %v; want true (locks are per server)", got, err)
	}
	if _, err := standbyConn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		t.Fatal(err)
	}
	// This session outlives the promotion: it must grant there too.
	existing := standbyConn

	killed := time.Now()
	took := p.failover(t)
	t.Logf("failover (kill primary, promote standby) took %v", took)
	maxBefore := slices.Max(before)

	select {
	case <-lk.Done():
		if !errors.Is(lk.Err(), pglock.ErrLost) {
			t.Errorf("advisory lock Err() = %v, want ErrLost", lk.Err())
		}
		t.Logf("advisory lock holder told ErrLost %v after the kill (observed once promotion returned)", time.Since(killed))
	case <-time.After(10 * time.Second): // liveness check is 200ms+1s; generous for a loaded machine
		t.Fatal("the advisory lock holder was not told within 10s that the primary died")
	}

	var f int64
	if err := existing.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('failover/raw', 'raw', 60000000) WHERE granted`).Scan(&f); err != nil {
		t.Fatalf("try_acquire in a session opened before promotion: %v", err)
	}
	if f <= maxBefore {
		t.Errorf("first fence after the failover = %d, want > %d (the highest before)", f, maxBefore)
	}

	renewOnNewPrimary(t, kept)
	t.Logf("lease holder renewed on the new primary %v after the kill", time.Since(killed))

	// Another client takes over the stale lease after the failover.
	poolB := newPool(t, p.url(), "failover-b")
	b := newLeases(t, poolB, "b")
	if err := b.ForceRelease(ctx, "failover/stale"); err != nil {
		t.Fatal(err)
	}
	taken, err := b.TryAcquire(ctx, "failover/stale", ttl)
	if err != nil {
		t.Fatal(err)
	}
	after := []int64{f, taken.Fence()}
	for range 3 {
		l, err := b.TryAcquire(ctx, "failover/churn", ttl)
		if err != nil {
			t.Fatal(err)
		}
		after = append(after, l.Fence())
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if minAfter := slices.Min(after); minAfter <= maxBefore {
		t.Errorf("a fence granted after the failover (%d) does not exceed every fence granted before (%d)", minAfter, maxBefore)
	}

	err = fencing.InTx(ctx, poolA, stale.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE failover_items SET holder = 'a-stale' WHERE id = 1`)
		return err
	})
	if !fencing.IsStale(err) {
		t.Errorf("write with the pre-failover token after a takeover = %v, want stale", err)
	}
	if err := fencing.InTx(ctx, poolB, taken.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE failover_items SET holder = 'b' WHERE id = 1`)
		return err
	}); err != nil {
		t.Fatalf("the new holder's fenced write: %v", err)
	}
	var holder string
	var fence int64
	if err := poolB.QueryRow(ctx, `SELECT holder, fence FROM failover_items WHERE id = 1`).Scan(&holder, &fence); err != nil {
		t.Fatal(err)
	}
	if holder != "b" || fence != taken.Fence() {
		t.Errorf("row after the failover: holder %q fence %d; want b, %d", holder, fence, taken.Fence())
	}
	if err := kept.Release(ctx); err != nil {
		t.Errorf("release the kept lease: %v", err)
	}
	if err := taken.Release(ctx); err != nil {
		t.Errorf("release the taken-over lease: %v", err)
	}
}

// TestFailoverAsyncLostTail: with asynchronous replication a failover can
// lose grants the old primary acknowledged. The test silences replication
// (a blackholed proxy in front of the walreceiver), grants leases on the
// primary, kills it and promotes the standby: the grants are gone, and a
// hand-written lease's sequence hands out a value that was already
// acknowledged — the hazard. pgfence's fences (database clock, per lease)
// do not: every fence granted on the new primary exceeds every acknowledged
// one, the holders of lost grants are told they lost them, and their fenced
// writes are rejected.
func TestFailoverAsyncLostTail(t *testing.T) {
	t.Parallel()
	p := startPair(t, false, true)
	ctx := ctxT(t, 2*time.Minute)

	poolA := newPool(t, p.url(), "failover-async-a")
	a := newLeases(t, poolA, "a")
	protectedTable(t, poolA, "async_items", "id int PRIMARY KEY, holder text NOT NULL")
	pre, err := a.TryAcquire(ctx, "async/pre", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// What a hand-written lease would draw its fences from.
	if _, err := poolA.Exec(ctx, `CREATE SEQUENCE hand_written_fence`); err != nil {
		t.Fatal(err)
	}
	p.waitCaughtUp(t)

	p.walProxy.Blackhole()
	// More grants than a sequence logs ahead (32 values per WAL record), so
	// that the standby's copy of the sequence is behind the last fence.
	const n = 100
	tail := make([]*leases.Lease, n)
	acked := make(map[int64]bool, n)
	var maxAcked int64
	handAcked := make(map[int64]bool, n)
	for i := range tail {
		l, err := a.TryAcquire(ctx, fmt.Sprintf("async/tail/%d", i), 8*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		tail[i] = l
		acked[l.Fence()] = true
		maxAcked = max(maxAcked, l.Fence())
		var v int64
		if err := poolA.QueryRow(ctx, `SELECT nextval('hand_written_fence')`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		handAcked[v] = true
	}

	killed := time.Now()
	took := p.failover(t)
	t.Logf("failover (kill primary, promote standby) took %v", took)
	admin := haConn(t, p.standby.URL("postgres"))
	var lostRows int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE name LIKE 'async/tail/%'`).Scan(&lostRows); err != nil {
		t.Fatal(err)
	}
	if lostRows != 0 {
		t.Fatalf("%d of %d grants made while replication was silenced reached the standby; the tail was not lost", lostRows, n)
	}

	// The hazard, with the hand-written sequence.
	var raw int64
	if err := admin.QueryRow(ctx, `SELECT nextval('hand_written_fence')`).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if !handAcked[raw] {
		t.Fatalf("the hand-written sequence on the new primary gave %d, not one of the lost acknowledged values: hazard not reproduced", raw)
	}
	t.Logf("a hand-written sequence handed out %d again after the failover", raw)

	// pgfence's fences, through leases on the multi-host URL.
	victims := tail[:5]
	poolB := newPool(t, p.url(), "failover-async-b")
	b := newLeases(t, poolB, "b")
	var taken []*leases.Lease
	for _, v := range victims {
		l, err := b.TryAcquire(ctx, v.Name(), 30*time.Second)
		if err != nil {
			t.Fatalf("take over the lost grant %s: %v", v.Name(), err)
		}
		if l.Fence() <= maxAcked {
			t.Errorf("lease %s granted fence %d after the failover; fence %d was acknowledged before it", l.Name(), l.Fence(), maxAcked)
		}
		taken = append(taken, l)
	}

	// The old holders are told: their next renewal finds no grant (or the
	// local deadline passes first).
	for _, l := range victims {
		select {
		case <-l.Done():
			if !errors.Is(l.Err(), leases.ErrLost) {
				t.Errorf("lease %s: Err() = %v, want ErrLost", l.Name(), l.Err())
			}
			t.Logf("holder of lost grant %s: %v (%v after the kill)", l.Name(), l.Err(), time.Since(killed))
		case <-time.After(15 * time.Second): // TTL 8s: the deadline alone ends it by then
			t.Fatalf("holder of %s was not told it lost the grant", l.Name())
		}
	}

	// And cannot write: the lease's current fence is the new holder's.
	err = fencing.InTx(ctx, poolA, victims[0].Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO async_items (id, holder) VALUES (1, 'a-stale')`)
		return err
	})
	if !fencing.IsStale(err) {
		t.Errorf("write with a lost grant's token = %v, want stale", err)
	}
	if err := fencing.InTx(ctx, poolB, taken[0].Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO async_items (id, holder) VALUES (1, 'b')`)
		return err
	}); err != nil {
		t.Fatalf("the new holder's fenced write: %v", err)
	}

	// A grant that did replicate survives, and its holder keeps it.
	renewOnNewPrimary(t, pre)
	for _, l := range append(taken, pre) {
		if err := l.Release(ctx); err != nil {
			t.Errorf("release %s: %v", l.Name(), err)
		}
	}
}
