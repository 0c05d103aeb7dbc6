package pglock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestLockUnlockReturnsConnectionToPool(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)

	lk, err := l.Lock(ctx, "jobs/a")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if lk.Name() != "jobs/a" || lk.Key() != Key("jobs/a") || lk.Shared() {
		t.Errorf("Name, Key, Shared = %q, %d, %v", lk.Name(), lk.Key(), lk.Shared())
	}
	if err := lk.Err(); err != nil {
		t.Errorf("Err while held = %v, want nil", err)
	}
	select {
	case <-lk.Done():
		t.Fatal("Done closed while held")
	default:
	}
	if n := pool.Stat().AcquiredConns(); n != 1 {
		t.Errorf("acquired connections while held = %d, want 1 (the pinned one)", n)
	}
	if n := advisoryLocks(t, pool); n != 1 {
		t.Errorf("advisory locks while held = %d, want 1", n)
	}
	total := pool.Stat().TotalConns()

	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	<-lk.Done()
	if !errors.Is(lk.Err(), ErrUnlocked) {
		t.Errorf("Err after Unlock = %v, want ErrUnlocked", lk.Err())
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Errorf("second Unlock = %v, want nil (repeats return the first result)", err)
	}
	assertIdle(t, pool)
	if got := pool.Stat().TotalConns(); got != total {
		t.Errorf("total connections after a clean Unlock = %d, want %d (returned, not destroyed)", got, total)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks after Unlock = %d, want 0", n)
	}
}

func TestTryLockConflicts(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)

	held, err := l.TryLock(ctx, "a")
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	if _, err := l.TryLock(ctx, "a"); !errors.Is(err, ErrLocked) {
		t.Fatalf("second TryLock on one name in one process = %v, want ErrLocked", err)
	}
	if n := pool.Stat().AcquiredConns(); n != 1 {
		t.Errorf("acquired connections after a refused TryLock = %d, want 1", n)
	}
	other, err := l.TryLock(ctx, "b")
	if err != nil {
		t.Fatalf("TryLock on another name: %v", err)
	}
	for _, lk := range []*Lock{held, other} {
		if err := lk.Unlock(ctx); err != nil {
			t.Errorf("Unlock %s: %v", lk.Name(), err)
		}
	}
	again, err := l.TryLock(ctx, "a")
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if err := again.Unlock(ctx); err != nil {
		t.Error(err)
	}
	assertIdle(t, pool)
}

// A Lock whose context ends while it waits fails with the context's error
// and destroys the connection it waited on.
func TestLockHonoursContextAndDestroysConnection(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)

	held, err := l.Lock(ctx, "busy")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	defer held.Unlock(ctx)

	wctx, cancel := context.WithCancel(ctx)
	type result struct {
		lk  *Lock
		err error
	}
	res := make(chan result, 1)
	go func() {
		lk, err := l.Lock(wctx, "busy")
		res <- result{lk, err}
	}()
	var waiter int32
	pgtest.WaitFor(t, 10*time.Second, "the second Lock to wait in PostgreSQL", func() bool {
		err := pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND`+inThisDB).Scan(&waiter)
		return err == nil
	})
	total := pool.Stat().TotalConns()
	cancel()
	r := <-res
	if !errors.Is(r.err, context.Canceled) || r.lk != nil {
		t.Fatalf("cancelled Lock = %v, %v; want nil, context.Canceled", r.lk, r.err)
	}
	if n := pool.Stat().AcquiredConns(); n != 1 {
		t.Errorf("acquired connections = %d, want 1 (the holder's)", n)
	}
	if got := pool.Stat().TotalConns(); got != total-1 {
		t.Errorf("total connections = %d, want %d: the waiter's connection must be destroyed", got, total-1)
	}
	if poolPIDs(t, pool)[uint32(waiter)] {
		t.Errorf("backend %d of the cancelled Lock is still in the pool", waiter)
	}
	pgtest.WaitFor(t, 10*time.Second, "the cancelled waiter's backend to exit", func() bool {
		return !backendAlive(t, pool, uint32(waiter))
	})
}

func TestLockExcludesGoroutines(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)

	const workers, rounds = 6, 25
	var inside, maxInside, total atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				lk, err := l.Lock(ctx, "counter")
				if err != nil {
					t.Errorf("Lock: %v", err)
					return
				}
				n := inside.Add(1)
				if n > maxInside.Load() {
					maxInside.Store(n)
				}
				time.Sleep(100 * time.Microsecond) // the critical section's work
				total.Add(1)
				inside.Add(-1)
				if err := lk.Unlock(ctx); err != nil {
					t.Errorf("Unlock: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := maxInside.Load(); got != 1 {
		t.Errorf("at most %d goroutines were inside at once, want 1", got)
	}
	if got := total.Load(); got != workers*rounds {
		t.Errorf("completed %d critical sections, want %d", got, workers*rounds)
	}
	assertIdle(t, pool)
}

// The compatibility matrix of PostgreSQL advisory locks, through pglock.
func TestSharedExclusiveMatrix(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	take := map[string]func(context.Context, string) (*Lock, error){
		"exclusive": l.TryLock,
		"shared":    l.TryRLock,
	}
	cases := []struct {
		held, want string
		ok         bool
	}{
		{"exclusive", "exclusive", false},
		{"exclusive", "shared", false},
		{"shared", "exclusive", false},
		{"shared", "shared", true},
	}
	for _, c := range cases {
		name := "matrix/" + c.held + "/" + c.want
		first, err := take[c.held](ctx, name)
		if err != nil {
			t.Fatalf("take %s: %v", c.held, err)
		}
		if first.Shared() != (c.held == "shared") {
			t.Errorf("Shared() = %v for a %s lock", first.Shared(), c.held)
		}
		second, err := take[c.want](ctx, name)
		switch {
		case c.ok && err != nil:
			t.Errorf("%s while %s held: %v, want granted", c.want, c.held, err)
		case !c.ok && !errors.Is(err, ErrLocked):
			t.Errorf("%s while %s held: %v, want ErrLocked", c.want, c.held, err)
		}
		if second != nil {
			if err := second.Unlock(ctx); err != nil {
				t.Errorf("Unlock second: %v", err)
			}
		}
		if err := first.Unlock(ctx); err != nil {
			t.Errorf("Unlock first: %v", err)
		}
	}

	// A blocking RLock waits for an exclusive holder, and gets in when it
	// leaves.
	ex, err := l.Lock(ctx, "matrix/wait")
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	got := make(chan error, 1)
	go func() {
		sh, err := l.RLock(ctx, "matrix/wait")
		if err == nil {
			err = sh.Unlock(ctx)
		}
		got <- err
	}()
	pgtest.WaitFor(t, 10*time.Second, "RLock to wait", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND mode = 'ShareLock' AND`+inThisDB).Scan(&n)
		return n == 1
	})
	if err := ex.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	if err := <-got; err != nil {
		t.Errorf("RLock after the exclusive holder left: %v", err)
	}
	assertIdle(t, pool)
}

// An operator in psql and the library contend for the same lock.
func TestOperatorViewPlainSQL(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	op, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Release()

	if _, err := op.Exec(ctx, `SELECT pg_advisory_lock(pgfence.lock_key('x'))`); err != nil {
		t.Fatalf("operator lock: %v", err)
	}
	if _, err := l.TryLock(ctx, "x"); !errors.Is(err, ErrLocked) {
		t.Errorf("TryLock while the operator holds x = %v, want ErrLocked", err)
	}
	var released bool
	if err := op.QueryRow(ctx, `SELECT pg_advisory_unlock(pgfence.lock_key('x'))`).Scan(&released); err != nil || !released {
		t.Fatalf("operator unlock = %v, %v", released, err)
	}

	lk, err := l.TryLock(ctx, "x")
	if err != nil {
		t.Fatalf("TryLock after the operator let go: %v", err)
	}
	var got bool
	if err := op.QueryRow(ctx, `SELECT pg_try_advisory_lock(pgfence.lock_key('x'))`).Scan(&got); err != nil || got {
		t.Errorf("operator try lock while the library holds x = %v, %v; want false", got, err)
	}
	// What the operator sees in pg_locks: the 64-bit key split in two.
	var classid, objid uint32
	var objsubid int
	err = op.QueryRow(ctx, `
		SELECT classid::text::bigint, objid::text::bigint, objsubid
		FROM pg_locks WHERE locktype = 'advisory' AND granted AND`+inThisDB).Scan(&classid, &objid, &objsubid)
	if err != nil {
		t.Fatalf("read pg_locks: %v", err)
	}
	k := uint64(lk.Key())
	if classid != uint32(k>>32) || objid != uint32(k) || objsubid != 1 {
		t.Errorf("pg_locks shows classid=%d objid=%d objsubid=%d; want %d, %d, 1", classid, objid, objsubid, uint32(k>>32), uint32(k))
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}
