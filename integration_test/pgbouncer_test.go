// PgBouncer in front of the shared server: what works in transaction
// pooling (leases, fencing, transaction-scoped advisory locks; lease
// hand-over by polling once the listener finds that notifications do not
// arrive), what is refused there (session advisory locks: pglock.ErrPooler),
// and that everything works in session pooling.
package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// TestPgBouncerTransactionLeases: through transaction pooling a lease is
// granted, refused to another owner (ErrHeld), renewed on demand and by the
// keepalive past its TTL, and handed over on release — by polling: the
// waiter's listener finds that its probe notification never arrives, says
// so once at Info, and waiters poll.
func TestPgBouncerTransactionLeases(t *testing.T) {
	t.Parallel()
	u := setup(t)
	bu := bouncer(t, u, pgtest.TransactionPooling)
	direct := newPool(t, u, "pgb-direct")
	logs := newLogRecorder()
	a := newLeases(t, newPool(t, bu, "pgb-a"), "a")
	b := newLeases(t, newPool(t, bu, "pgb-b"), "b",
		leases.WithLogger(logs.logger()), leases.WithPollInterval(200*time.Millisecond))
	ctx := ctxT(t, 2*time.Minute)

	// TTL 3s: the keepalive renews every second and loses the lease only
	// if one renewal through PgBouncer stalls for 1.7s. At 1s a stall of
	// 0.6s lost it on a loaded CI machine, which is not what this tests.
	const ttl = 3 * time.Second
	la, err := a.TryAcquire(ctx, "job", ttl)
	if err != nil {
		t.Fatalf("TryAcquire through PgBouncer: %v", err)
	}
	_, err = b.TryAcquire(ctx, "job", ttl)
	var held *leases.HeldError
	if !errors.Is(err, leases.ErrHeld) || !errors.As(err, &held) || held.Holder.Owner != la.Owner() || held.Holder.Fence != la.Fence() {
		t.Fatalf("TryAcquire of a held lease: %v, want ErrHeld naming %s fence %d", err, la.Owner(), la.Fence())
	}

	before := la.ExpiresAt()
	if err := la.Renew(ctx); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if !la.ExpiresAt().After(before) {
		t.Errorf("Renew did not move expires_at: %v, then %v", before, la.ExpiresAt())
	}
	// The keepalive (every TTL/3) must carry the lease well past the expiry
	// of its last explicit renewal, by the database clock.
	mustRenewPastExpiry(t, ctx, direct, la)

	got := make(chan *leases.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, "job", ttl)
		got <- l
		errc <- err
	}()
	// b's Acquire waits, which starts its listener: LISTEN succeeds, the
	// probe never comes back.
	logs.await(t, 20*time.Second, "saying notifications do not reach the client", fallbackLogged)
	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	released := time.Now()
	lb, err := <-got, <-errc
	if err != nil {
		t.Fatalf("Acquire after release: %v", err)
	}
	defer lb.Release(context.Background())
	// Polling at 200ms (jittered, backing off from 50ms while no listener
	// works): generous bound for a loaded machine.
	if d := time.Since(released); d > 5*time.Second {
		t.Errorf("hand-over by polling took %v, want within the poll interval (bound 5s)", d)
	}
	if lb.Fence() <= la.Fence() {
		t.Errorf("fence after hand-over %d, want > %d", lb.Fence(), la.Fence())
	}
	if !errors.Is(la.Err(), leases.ErrReleased) {
		t.Errorf("released lease's Err: %v, want ErrReleased", la.Err())
	}
	if n := logs.count(fallbackLogged); n != 1 {
		t.Errorf("fallback logged %d times, want once", n)
	}
}

// TestPgBouncerHandOverByNotification: directly and through session
// pooling the listener's probe arrives, so a waiter sleeping far longer
// than the test's bound (poll interval 1h, holder's TTL 1m) is woken by the
// release's notification; nothing logs a fallback.
func TestPgBouncerHandOverByNotification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		viaURL func(t *testing.T, u string) string
	}{
		{"direct", func(t *testing.T, u string) string { return u }},
		{"session pooling", func(t *testing.T, u string) string { return bouncer(t, u, pgtest.SessionPooling) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u := setup(t)
			cu := tc.viaURL(t, u)
			logs := newLogRecorder()
			a := newLeases(t, newPool(t, cu, "pgb-a"), "a")
			b := newLeases(t, newPool(t, cu, "pgb-b"), "b",
				leases.WithLogger(logs.logger()), leases.WithPollInterval(time.Hour))
			ctx := ctxT(t, time.Minute)
			la, err := a.TryAcquire(ctx, "job", time.Minute)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			got := make(chan *leases.Lease, 1)
			errc := make(chan error, 1)
			go func() {
				l, err := b.Acquire(ctx, "job", time.Minute)
				got <- l
				errc <- err
			}()
			// Once the listener works, the waiter sleeps until just after
			// the holder's expiry, a minute away.
			logs.await(t, 20*time.Second, "of the waiter going to sleep for 10s or more", waitingAtLeast(10*time.Second))
			if err := la.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			released := time.Now()
			lb, err := <-got, <-errc
			if err != nil {
				t.Fatalf("Acquire after release: %v", err)
			}
			defer lb.Release(context.Background())
			// A notification takes a round trip; 5s is generous for a
			// loaded machine and far below the waiter's sleep.
			if d := time.Since(released); d > 5*time.Second {
				t.Errorf("hand-over took %v, want about a round trip (bound 5s)", d)
			}
			if n := logs.count(fallbackLogged); n != 0 {
				t.Errorf("fallback to polling logged %d times, want never", n)
			}
		})
	}
}

// TestPgBouncerTransactionFencing: through transaction pooling the fenced
// transaction's token (SET LOCAL) holds for its transaction, so the guard
// accepts the current holder and rejects the one a takeover made stale.
func TestPgBouncerTransactionFencing(t *testing.T) {
	t.Parallel()
	u := setup(t)
	pool := newPool(t, bouncer(t, u, pgtest.TransactionPooling), "pgb-fencing")
	protectedTable(t, pool, "account", "id int PRIMARY KEY, balance int NOT NULL")
	a, b := newLeases(t, pool, "a"), newLeases(t, pool, "b")
	ctx := ctxT(t, time.Minute)
	write := func(tok fencing.Token, sql string) error {
		return fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql)
			return err
		})
	}

	la, err := a.TryAcquire(ctx, "account", 30*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	defer la.Release(context.Background())
	if err := write(la.Token(), "INSERT INTO account (id, balance) VALUES (1, 100)"); err != nil {
		t.Fatalf("holder's fenced insert: %v", err)
	}
	if err := b.ForceRelease(ctx, "account"); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
	lb, err := b.TryAcquire(ctx, "account", 30*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire after ForceRelease: %v", err)
	}
	defer lb.Release(context.Background())
	if err := write(la.Token(), "UPDATE account SET balance = 0 WHERE id = 1"); !errors.Is(err, fencing.ErrStale) {
		t.Errorf("stale holder's fenced update: %v, want ErrStale", err)
	}
	if err := write(lb.Token(), "UPDATE account SET balance = 50 WHERE id = 1"); err != nil {
		t.Errorf("current holder's fenced update: %v", err)
	}
	var balance int
	var fence int64
	if err := pool.QueryRow(ctx, "SELECT balance, fence FROM account WHERE id = 1").Scan(&balance, &fence); err != nil {
		t.Fatal(err)
	}
	if balance != 50 || fence != lb.Fence() {
		t.Errorf("row: balance %d fence %d, want 50 and %d", balance, fence, lb.Fence())
	}
}

// TestPgBouncerTransactionXactLock: transaction-scoped advisory locks live
// exactly as long as the transaction, which transaction pooling keeps on
// one server session, so they exclude each other through PgBouncer.
func TestPgBouncerTransactionXactLock(t *testing.T) {
	t.Parallel()
	u := setup(t)
	pool := newPool(t, bouncer(t, u, pgtest.TransactionPooling), "pgb-xact")
	direct := newPool(t, u, "pgb-direct")
	ctx := ctxT(t, time.Minute)
	begin := func() pgx.Tx {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
		return tx
	}

	tx1 := begin()
	if err := pglock.XactLock(ctx, tx1, "x"); err != nil {
		t.Fatalf("XactLock: %v", err)
	}
	tx2 := begin()
	if ok, err := pglock.TryXactLock(ctx, tx2, "x"); err != nil || ok {
		t.Fatalf("TryXactLock while another transaction holds it: %v, %v; want false", ok, err)
	}
	_ = tx2.Rollback(ctx)

	done := make(chan error, 1)
	tx3 := begin()
	go func() { done <- pglock.XactLock(ctx, tx3, "x") }()
	mustWait(t, 10*time.Second, "the second XactLock to wait in pg_locks", func() (bool, error) {
		var n int
		err := direct.QueryRow(ctx, sqlCountAdvisoryLocks+" AND NOT granted").Scan(&n)
		return n == 1, err
	})
	select {
	case err := <-done:
		t.Fatalf("XactLock returned while another transaction held the lock: %v", err)
	default:
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("XactLock after the holder committed: %v", err)
	}
	tx4 := begin()
	if ok, err := pglock.TryXactLock(ctx, tx4, "x"); err != nil || ok {
		t.Errorf("TryXactLock while the waiter's transaction holds it: %v, %v; want false", ok, err)
	}
	_ = tx4.Rollback(ctx)
	if err := tx3.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	tx5 := begin()
	if ok, err := pglock.TryXactLock(ctx, tx5, "x"); err != nil || !ok {
		t.Errorf("TryXactLock once free: %v, %v; want true", ok, err)
	}
	_ = tx5.Commit(ctx)
}

// TestPgBouncerTransactionSessionLockRefused: a session advisory lock taken
// through transaction pooling is granted to whichever server session ran
// that statement. Here another client is handed that server session right
// after the grant (PgBouncer reuses the most recently released one first),
// as happens under load; pglock's check then runs on another server
// session and every acquire mode fails with ErrPooler, returning no Lock.
// The lock stays with the server session the other client now has, which
// releases it.
func TestPgBouncerTransactionSessionLockRefused(t *testing.T) {
	t.Parallel()
	u := setup(t)
	bu := bouncer(t, u, pgtest.TransactionPooling, pgtest.WithBouncerSetting("default_pool_size", "2"))
	ctx := ctxT(t, time.Minute)
	other, err := pgx.Connect(ctx, bu)
	if err != nil {
		t.Fatalf("connect the other client: %v", err)
	}
	defer other.Close(context.Background())

	var (
		mu      sync.Mutex
		armed   bool
		otherTx pgx.Tx
		hookErr error
	)
	tracer := &advisoryLockTracer{onLocked: func() {
		mu.Lock()
		defer mu.Unlock()
		if !armed {
			return
		}
		armed = false
		otherTx, hookErr = other.Begin(ctx)
		if hookErr == nil {
			_, hookErr = otherTx.Exec(ctx, "SELECT 1") // BEGIN alone is sent lazily: take a server session now
		}
	}}
	pool := newPool(t, bu, "pgb-session-lock", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
	locker := newLocker(t, pool)

	for _, op := range []struct {
		name   string
		shared bool
		call   func(context.Context, string) (*pglock.Lock, error)
	}{
		{"Lock", false, locker.Lock},
		{"TryLock", false, locker.TryLock},
		{"RLock", true, locker.RLock},
		{"TryRLock", true, locker.TryRLock},
	} {
		name := "session/" + op.name
		mu.Lock()
		armed, otherTx, hookErr = true, nil, nil
		mu.Unlock()
		lk, err := op.call(ctx, name)
		mu.Lock()
		tx, herr := otherTx, hookErr
		mu.Unlock()
		if tx == nil || herr != nil {
			t.Fatalf("%s: the other client did not take a server session after the grant: %v", op.name, herr)
		}
		if !errors.Is(err, pglock.ErrPooler) {
			t.Errorf("%s through transaction pooling: %v, want ErrPooler (is the session check wired into pglock's acquire?)", op.name, err)
		} else if lk != nil {
			t.Errorf("%s returned a Lock with ErrPooler", op.name)
		}
		if lk != nil {
			_ = lk.Unlock(ctx) // runs on another server session; the lock stays
		}
		// The other client was handed the server session that holds the
		// lock: release it there.
		unlock := "SELECT pg_advisory_unlock($1)"
		if op.shared {
			unlock = "SELECT pg_advisory_unlock_shared($1)"
		}
		var ok bool
		if err := tx.QueryRow(ctx, unlock, pglock.Key(name)).Scan(&ok); err != nil || !ok {
			t.Errorf("%s: unlock from the server session holding the lock: %v, %v (want true: PgBouncer handed the other client that session)", op.name, ok, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("%s: commit the other client: %v", op.name, err)
		}
	}
}

// TestPgBouncerSessionPooling: in session pooling each client keeps its
// server session, so everything works: session advisory locks (exclusion,
// Unlock, Do), transaction locks, leases.
func TestPgBouncerSessionPooling(t *testing.T) {
	t.Parallel()
	u := setup(t)
	bu := bouncer(t, u, pgtest.SessionPooling, pgtest.WithBouncerSetting("default_pool_size", "8"))
	pool := newPool(t, bu, "pgb-session", func(c *pgxpool.Config) { c.MaxConns = 6 })
	ctx := ctxT(t, time.Minute)

	locker := newLocker(t, pool)
	lk, err := locker.Lock(ctx, "s")
	if err != nil {
		t.Fatalf("Lock through session pooling: %v", err)
	}
	if _, err := locker.TryLock(ctx, "s"); !errors.Is(err, pglock.ErrLocked) {
		t.Errorf("TryLock of a held lock: %v, want ErrLocked", err)
	}
	if _, err := locker.TryRLock(ctx, "s"); !errors.Is(err, pglock.ErrLocked) {
		t.Errorf("TryRLock of an exclusively held lock: %v, want ErrLocked", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	r1, err := locker.RLock(ctx, "s")
	if err != nil {
		t.Fatalf("RLock: %v", err)
	}
	r2, err := locker.TryRLock(ctx, "s")
	if err != nil {
		t.Fatalf("TryRLock beside another shared holder: %v", err)
	}
	for _, r := range []*pglock.Lock{r1, r2} {
		if err := r.Unlock(ctx); err != nil {
			t.Errorf("Unlock shared: %v", err)
		}
	}
	ran := false
	if err := locker.Do(ctx, "s", func(context.Context, *pglock.Lock) error { ran = true; return nil }); err != nil || !ran {
		t.Errorf("Do: ran %v, %v", ran, err)
	}

	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(context.Background())
	if err := pglock.XactLock(ctx, tx1, "x"); err != nil {
		t.Fatalf("XactLock: %v", err)
	}
	tx2, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := pglock.TryXactLock(ctx, tx2, "x"); err != nil || ok {
		t.Errorf("TryXactLock while held: %v, %v; want false", ok, err)
	}
	_ = tx2.Rollback(ctx)
	_ = tx1.Commit(ctx)

	c := newLeases(t, pool, "s")
	l, err := c.TryAcquire(ctx, "job", 5*time.Second)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if _, err := c.TryAcquire(ctx, "job", 5*time.Second); !errors.Is(err, leases.ErrHeld) {
		t.Errorf("second TryAcquire: %v, want ErrHeld", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if n := pgtest.Acquired(pool); n != 0 {
		t.Errorf("%d connections still acquired", n)
	}
}
