package integration_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pglock"
)

// countSessions counts the sessions of application app.
func countSessions(ctx context.Context, admin *pgxpool.Pool, app string) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, app).Scan(&n)
	return n, err
}

func TestDriversLockExclusive(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		l1 := mustLocker(t, d.open(t, u, "one"))
		l2 := mustLocker(t, d.open(t, u, "two"))

		lk, err := l1.TryLock(ctx, "job")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		_, err = l2.TryLock(ctx, "job")
		var held *pglock.HeldError
		if !errors.Is(err, pglock.ErrLocked) || !errors.As(err, &held) || len(held.Holders) != 1 {
			t.Fatalf("second TryLock: got %v, want a *HeldError naming one holder", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		// A confirmed unlock returns the session to the pool: it lives on.
		if n, err := countSessions(ctx, admin, "one"); err != nil || n == 0 {
			t.Fatalf("sessions of one after Unlock: %d, %v; want the pinned one back in the pool", n, err)
		}
		lk2, err := l2.TryLock(ctx, "job")
		if err != nil {
			t.Fatalf("TryLock after Unlock: %v", err)
		}
		if err := lk2.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}

		// Sets: all or none, with the names taken before a refusal given back.
		all, err := l1.TryLockAll(ctx, "b", "a")
		if err != nil {
			t.Fatalf("TryLockAll: %v", err)
		}
		if _, err := l2.TryLockAll(ctx, "c", "a"); !errors.Is(err, pglock.ErrLocked) {
			t.Fatalf("overlapping TryLockAll: got %v, want ErrLocked", err)
		}
		c, err := l1.TryLock(ctx, "c")
		if err != nil {
			t.Fatalf("TryLock c after a refused set: %v (the refused set kept it)", err)
		}
		infos, err := l2.Get(ctx, "a")
		if err != nil || len(infos) != 1 || !infos[0].Granted {
			t.Fatalf("Get a: %+v, %v; want one holder", infos, err)
		}
		for _, lk := range []*pglock.Lock{c, all} {
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock %s: %v", lk.Name(), err)
			}
		}
		locked, err := l2.LockAll(ctx, "a", "b", "c")
		if err != nil {
			t.Fatalf("LockAll after Unlock: %v", err)
		}
		if err := locked.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	})
}

func TestDriversLockLost(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		l := mustLocker(t, d.open(t, u, "holder"), pglock.WithLivenessCheck(50*time.Millisecond, time.Second))
		lk, err := l.TryLock(ctx, "lost")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		// The pids of the backends terminated (FILTER runs on the rows WHERE
		// kept, so nothing else is terminated).
		var pids []int32
		err = admin.QueryRow(ctx, `SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}')
		  FROM pg_stat_activity WHERE application_name = 'holder' AND datname = current_database()`).Scan(&pids)
		if err != nil || len(pids) == 0 {
			t.Fatalf("terminate the holder's backends: %v, %v", pids, err)
		}
		// Over pgx the socket tells within milliseconds; over database/sql
		// the next liveness query, within 50ms + 1s. 10s is generous for a
		// loaded machine.
		select {
		case <-lk.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the Lock's Context did not end after its backend was terminated")
		}
		if !errors.Is(lk.Err(), pglock.ErrLost) {
			t.Fatalf("Err: %v, want ErrLost", lk.Err())
		}
		if err := lk.Unlock(ctx); !errors.Is(err, pglock.ErrLost) {
			t.Fatalf("Unlock after loss: %v, want ErrLost", err)
		}
		awaitLocksReleased(t, admin, pids...)
		again, err := l.TryLock(ctx, "lost")
		if err != nil {
			t.Fatalf("TryLock after the loss: %v", err)
		}
		if err := again.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	})
}

// An abandoned wait leaves no backend waiting, and the session that waited
// is destroyed (its lock state was in doubt), not returned to the pool.
func TestDriversLockAbandonedWait(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		holder := mustLocker(t, d.open(t, u, "holder"))
		waiter := mustLocker(t, d.open(t, u, "waiter"))
		lk, err := holder.TryLock(ctx, "w")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		defer func() { _ = lk.Unlock(ctx) }()

		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pid, errc := startWait(t, ctx, admin, waiter, wctx)
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Lock: %v, want context.Canceled", err)
			}
		case <-time.After(15 * time.Second): // the clean-up is bounded by the 5s unlock timeout
			t.Fatal("Lock did not return after its context was cancelled")
		}
		// Lock returns only once the server has ended the wait (pg_locks
		// shows every database: other subtests run in their own).
		var waiting int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting); err != nil || waiting != 0 {
			t.Fatalf("backends still waiting after Lock returned: %d (%v)", waiting, err)
		}
		mustWait(t, 5*time.Second, "the waiter's session to be closed", func() (bool, error) {
			var n int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n)
			return err == nil && n == 0, err
		})
	})
}

// startWait runs waiter.Lock(wctx, "w"), or LockAll of names if any, in a
// goroutine, and returns the backend that queues for it (of application
// "waiter", read on admin within ctx) and the channel that receives its
// error.
func startWait(t *testing.T, ctx context.Context, admin *pgxpool.Pool, waiter *pglock.Locker, wctx context.Context, names ...string) (int32, <-chan error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		var err error
		switch {
		case len(names) > 0:
			_, err = waiter.LockAll(wctx, names...)
		default:
			_, err = waiter.Lock(wctx, "w")
		}
		errc <- err
	}()
	var pid int32
	mustWait(t, 10*time.Second, "the waiter to queue", func() (bool, error) {
		err := admin.QueryRow(ctx, `SELECT l.pid FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
		 WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = 'waiter'
		   AND a.datname = current_database()`).Scan(&pid)
		return err == nil, nil
	})
	return pid, errc
}

// A wait whose deadline passes while another session holds the name is
// ended by the server itself (its lock_timeout) and keeps its session,
// over every driver: ten such waits wait on one backend, where each
// waited on another before (its session destroyed). So does a LockAll
// whose first name is free, once it has given that name back. The session
// stays clean: the next Lock is granted once the name is free.
func TestDriversRefusedWaitKeepsItsSession(t *testing.T) {
	free := "a" // before "w" in a set: a lower key
	for i := 0; pglock.Key(free) >= pglock.Key("w"); i++ {
		free = fmt.Sprintf("a%d", i)
	}
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		holder := mustLocker(t, d.open(t, u, "holder"))
		waiter := mustLocker(t, d.open(t, u, "waiter"))
		held, err := holder.TryLock(ctx, "w")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		defer func() { _ = held.Unlock(ctx) }()
		backends := map[int32]bool{}
		for i := range 20 {
			var set []string // Lock, then LockAll of the free name and "w"
			if i%2 == 1 {
				set = []string{free, "w"}
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			pid, errc := startWait(t, ctx, admin, waiter, wctx, set...)
			backends[pid] = true
			err := <-errc
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("wait %d (set %q): %v, want its deadline", i, set, err)
			}
			if set == nil {
				continue
			}
			lk, err := holder.TryLock(ctx, free)
			if err != nil {
				t.Fatalf("wait %d: %q, taken before the refused name, is not free: %v", i, free, err)
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(backends) != 1 {
			t.Errorf("20 refused waits waited on %d backends, want 1: %v", len(backends), backends)
		}
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		lk, err := waiter.Lock(ctx, "w")
		if err != nil {
			t.Fatalf("Lock once free: %v", err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestDriversLockSilentNetwork (scenario: the network between a process
// and the server goes silent — packets dropped, nothing closed — while it
// holds a Lock, or while a Lock call waits). Over every driver the held
// Lock's Context ends within the liveness interval + timeout and Unlock
// returns at once, and the abandoned wait returns within the unlock
// timeout. lib/pq does not end a statement at its context's end on a
// silent network (it sends a cancel request and keeps reading): pglock no
// longer waits for it, and discards the connection once lib/pq returns.
func TestDriversLockSilentNetwork(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		px := proxyTo(t, admin)
		h := d.open(t, px.URL(t, u), "holder")
		const interval, timeout, unlock = 200 * time.Millisecond, 300 * time.Millisecond, 500 * time.Millisecond
		l := mustLocker(t, h, pglock.WithLivenessCheck(interval, timeout), pglock.WithUnlockTimeout(unlock))
		lk, err := l.TryLock(ctx, "held")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		blocker := mustLocker(t, d.open(t, u, "blocker"))
		busy, err := blocker.TryLock(ctx, "busy")
		if err != nil {
			t.Fatalf("TryLock: %v", err)
		}
		defer func() { _ = busy.Unlock(ctx) }()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		waited := make(chan error, 1)
		go func() {
			w, err := l.Lock(wctx, "busy")
			if err == nil {
				err = w.Unlock(ctx)
			}
			waited <- err
		}()
		mustWait(t, 30*time.Second, "the Lock call to wait", func() (bool, error) {
			var n int
			err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = 'holder' AND wait_event = 'advisory'`).Scan(&n)
			return n > 0, err
		})

		px.Blackhole()
		start := time.Now()
		cancel()
		// Each bound is generous (a loaded machine); the real figures are logged.
		select {
		case err := <-waited:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("the abandoned Lock = %v, want context.Canceled", err)
			}
			t.Logf("the abandoned wait returned after %v", time.Since(start))
		case <-time.After(unlock + 10*time.Second):
			t.Errorf("the abandoned wait had not returned %v after its context ended", time.Since(start))
		}
		select {
		case <-lk.Done():
			t.Logf("Done closed %v after the network went silent", time.Since(start))
		case <-time.After(interval + timeout + 10*time.Second):
			t.Errorf("Done not closed %v after the network went silent", time.Since(start))
		}
		ustart := time.Now()
		if err := lk.Unlock(ctx); !errors.Is(err, pglock.ErrLost) {
			t.Errorf("Unlock after the loss = %v, want ErrLost", err)
		}
		if took := time.Since(ustart); took > 10*time.Second {
			t.Errorf("Unlock took %v", took)
		}
		// The connections a driver still reads from are discarded once it
		// returns, which a closed network makes it do.
		px.Close()
		mustWait(t, 30*time.Second, "the holder's connections to be given up", func() (bool, error) { return h.inUse() == 0, nil })
	})
}
