package pglock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/metrictest"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// byKey returns names in the order a set takes them: by Key.
func byKey(names ...string) []string {
	s, err := newSet(names)
	if err != nil {
		panic(err) // the tests' own names
	}
	return s.names
}

// reversed returns names in the reverse order.
func reversed(names []string) []string {
	r := slices.Clone(names)
	slices.Reverse(r)
	return r
}

// without returns names less drop, in the same order.
func without(names []string, drop string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == drop })
}

// assertFree checks that no other session holds any of names: a session
// of l takes them all at once, and gives them back.
func assertFree(t testing.TB, ctx context.Context, l *Locker, names ...string) {
	t.Helper()
	lk, err := l.TryLockAll(ctx, names...)
	if err != nil {
		t.Fatalf("TryLockAll %q: %v (is something left held?)", names, err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// heldBy counts the advisory locks granted to backend pid.
func heldBy(t testing.TB, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, pid uint32) int {
	t.Helper()
	var n int
	if err := q.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1`, int32(pid)).Scan(&n); err != nil {
		t.Fatalf("count locks of backend %d: %v", pid, err)
	}
	return n
}

// 16 goroutines take random overlapping sets of 2 to 5 of 8 names, each
// set in a random order (now and then with a name twice), by LockAll on a
// session, by XactLockAll in a transaction, or one name by Lock, 25 times
// each. A count of holders per name, kept in memory, proves that no two
// ever hold a name at once; no call may fail, in particular not with
// PostgreSQL's deadlock error (40P01). Taking the names in the caller's
// order instead of by key makes this test fail with 40P01 within a few
// rounds.
func TestLockAllNeverDeadlocks(t *testing.T) {
	t.Parallel()
	const goroutines, rounds = 16, 25
	names := []string{"all/a", "all/b", "all/c", "all/d", "all/e", "all/f", "all/g", "all/h"}
	pool := newPool(t, pgtest.URL(t), goroutines+2)
	l := newLocker(t, pool)
	ctx := testContext(t)

	var holders [8]atomic.Int32 // per name, by index in names
	var sessions, xacts, singles atomic.Int64
	inside := func(idx []int) {
		for _, j := range idx {
			if n := holders[j].Add(1); n != 1 {
				t.Errorf("%s held by %d callers at once", names[j], n)
			}
		}
		time.Sleep(time.Duration(100+rand.IntN(400)) * time.Microsecond) // the critical section's work
		for _, j := range idx {
			holders[j].Add(-1)
		}
	}
	session := func(set []string, idx []int) error {
		lk, err := l.LockAll(ctx, set...)
		if err != nil {
			return err
		}
		inside(idx)
		return lk.Unlock(ctx)
	}
	xact := func(set []string, idx []int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := XactLockAll(ctx, tx, set...); err != nil {
				return err
			}
			inside(idx)
			return nil
		})
	}
	single := func(set []string, idx []int) error {
		lk, err := l.Lock(ctx, set[0])
		if err != nil {
			return err
		}
		inside(idx[:1])
		return lk.Unlock(ctx)
	}

	start := time.Now()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			for range rounds {
				idx := rng.Perm(len(names))[:2+rng.IntN(4)]
				set := make([]string, len(idx))
				for i, j := range idx {
					set[i] = names[j]
				}
				if rng.IntN(4) == 0 {
					set = append(set, set[0]) // a name twice counts once
				}
				var err error
				switch rng.IntN(5) {
				case 0, 1:
					sessions.Add(1)
					err = session(set, idx)
				case 2, 3:
					xacts.Add(1)
					err = xact(set, idx)
				default:
					singles.Add(1)
					err = single(set, idx)
				}
				if pgerr.Code(err) == "40P01" {
					t.Errorf("deadlock taking %q: %v", set, err)
					return
				} else if err != nil {
					t.Errorf("taking %q: %v", set, err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	t.Logf("%d LockAll, %d XactLockAll and %d Lock calls in %v", sessions.Load(), xacts.Load(), singles.Load(), elapsed.Round(time.Millisecond))
	// About 400 short critical sections on 8 names take a few seconds even
	// on two shared cores under -race; a deadlock costs deadlock_timeout
	// (1s) per occurrence, and an undetected one the test's 60s.
	if elapsed > 45*time.Second {
		t.Errorf("took %v, want well under 45s", elapsed)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks after all rounds = %d, want 0", n)
	}
	assertIdle(t, pool)
}

// TryLockAll is all or none: when one name of the set is held elsewhere
// it reports that name and its holder, and leaves nothing of the set
// held, wherever the held name falls in the order the set is taken in; its
// connection goes back to the pool.
func TestTryLockAllAllOrNone(t *testing.T) {
	t.Parallel()
	set := byKey("try-all/a", "try-all/b", "try-all/c", "try-all/d")
	for _, c := range []struct{ desc, held string }{
		{"held name taken last", set[len(set)-1]},
		{"held name taken first", set[0]},
		{"held name in between", set[2]},
	} {
		t.Run(c.desc, func(t *testing.T) {
			t.Parallel()
			pool, l := setup(t)
			ctx := testContext(t)
			holder, err := l.Lock(ctx, c.held)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Unlock(ctx)

			lk, err := l.TryLockAll(ctx, reversed(set)...) // the caller's order does not matter
			var he *HeldError
			if lk != nil || !errors.Is(err, ErrLocked) || !errors.As(err, &he) {
				t.Fatalf("TryLockAll with %q held = %v, %v; want a *HeldError matching ErrLocked", c.held, lk, err)
			}
			if he.Name != c.held || he.Key != Key(c.held) || len(he.Holders) != 1 || he.Holders[0].PID != int32(holder.pid) {
				t.Errorf("HeldError = %+v, want %q held by backend %d", he, c.held, holder.pid)
			}
			if want := fmt.Sprintf("pglock: try lock all %q: lock %q held by pid %d ", set, c.held, holder.pid); !strings.HasPrefix(err.Error(), want) {
				t.Errorf("error = %q, want it to start %q", err, want)
			}
			// The give-back was confirmed, so the connection was kept:
			// the holder's and the refused one's.
			if n := pool.Stat().TotalConns(); n != 2 {
				t.Errorf("total connections = %d, want 2", n)
			}
			if n := advisoryLocks(t, pool); n != 1 {
				t.Errorf("advisory locks after the refusal = %d, want 1 (the holder's)", n)
			}
			// Another session takes every other name of the set at once.
			assertFree(t, ctx, l, without(set, c.held)...)
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			assertIdle(t, pool)
		})
	}
}

// PostgreSQL releases transaction locks taken inside a subtransaction that
// is rolled back, which TryXactLockAll relies on: refused, it leaves tx
// holding what it held before and nothing of the set, and tx stays usable.
func TestTryXactLockAllRollsBackPartialSet(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	set := byKey("xact-all/a", "xact-all/b", "xact-all/c")
	held := set[len(set)-1] // the others are taken before the refusal
	holder, err := l.Lock(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Unlock(ctx)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if err := XactLock(ctx, tx, "xact-all/before"); err != nil {
		t.Fatal(err)
	}

	if ok, err := TryXactLockAll(ctx, tx, reversed(set)...); ok || err != nil {
		t.Fatalf("TryXactLockAll with %q held = %v, %v; want false, nil", held, ok, err)
	}
	// While tx is still open, another session takes the rest of the set:
	// rolling back to the savepoint released what the try took.
	assertFree(t, ctx, l, without(set, held)...)
	// What tx held before is still held.
	if _, err := l.TryLock(ctx, "xact-all/before"); !errors.Is(err, ErrLocked) {
		t.Errorf("TryLock of the name tx took before = %v, want ErrLocked", err)
	}
	// tx is usable and takes the whole set once it is free.
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, err := TryXactLockAll(ctx, tx, set...); !ok || err != nil {
		t.Fatalf("TryXactLockAll of a free set = %v, %v; want true, nil", ok, err)
	}
	for _, n := range set {
		if _, err := l.TryLock(ctx, n); !errors.Is(err, ErrLocked) {
			t.Errorf("TryLock %q while tx holds the set = %v, want ErrLocked", n, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks after commit = %d, want 0", n)
	}
	assertIdle(t, pool)
}

// A LockAll whose context ends while it waits for the last name of its
// set returns promptly with the context's error even when its cancel
// request is lost (the fallback finds its backend by the set's keys), and
// no backend of it is left waiting. Its session, which held the names
// taken before the wait, gives them back: at a deadline, which the server
// enforces by itself, it releases them and goes back to the pool (keep);
// when cancelled, it is destroyed and the pool keeps no connection.
func TestLockAllAbandonedWait(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"deadline", "cancel"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			pool, l := setup(t)
			l.hooks.noCancelRequest = true // as if lost on the network
			ctx := testContext(t)
			set := byKey("abandon-all/a", "abandon-all/b", "abandon-all/c")
			held := set[len(set)-1]
			holder, err := l.Lock(ctx, held)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Unlock(ctx)

			var wctx context.Context
			var cancel context.CancelFunc
			if how == "deadline" {
				// Far enough for the wait to begin, and be seen, on a
				// loaded machine (1s was not: CI saw the deadline pass
				// before the wait showed in pg_stat_activity).
				wctx, cancel = context.WithTimeout(ctx, 3*time.Second)
			} else {
				wctx, cancel = context.WithCancel(ctx)
			}
			defer cancel()
			type result struct {
				lk  *Lock
				err error
				at  time.Time
			}
			got := make(chan result, 1)
			go func() {
				lk, err := l.LockAll(wctx, set...)
				got <- result{lk, err, time.Now()}
			}()
			var waiter int32
			pgtest.WaitFor(t, 10*time.Second, "LockAll to wait", func() bool {
				err := pool.QueryRow(ctx, `
					SELECT pid FROM pg_stat_activity
					 WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND datname = current_database()`).Scan(&waiter)
				return err == nil
			})
			if n := heldBy(t, ctx, pool, uint32(waiter)); n != len(set)-1 {
				t.Fatalf("the waiting backend holds %d locks, want %d (the names before %q)", n, len(set)-1, held)
			}
			var ended time.Time
			if how == "cancel" {
				ended = time.Now()
				cancel()
			} else {
				ended, _ = wctx.Deadline()
			}
			r := <-got
			// The server ends the wait at once (its lock_timeout, or
			// pg_cancel_backend from another connection); 2s allows for
			// a loaded machine and is well below the 5s unlock timeout
			// after which pglock would give up on the server's answer.
			overrun := r.at.Sub(ended)
			t.Logf("LockAll returned %v after its context ended", overrun)
			if overrun > 2*time.Second {
				t.Errorf("LockAll returned %v after its context ended, want promptly", overrun)
			}
			want := context.DeadlineExceeded
			if how == "cancel" {
				want = context.Canceled
			}
			if r.lk != nil || !errors.Is(r.err, want) {
				t.Fatalf("LockAll with an ending context = %v, %v; want %v", r.lk, r.err, want)
			}
			// At the deadline, the server's refusal says why (SQLSTATE 55P03).
			wantText := fmt.Sprintf("pglock: lock all %q: %v", set, want)
			if how == "deadline" {
				wantText += " (ERROR: canceling statement due to lock timeout (SQLSTATE 55P03))"
			}
			if r.err.Error() != wantText {
				t.Errorf("error = %q, want %q", r.err, wantText)
			}
			pgtest.WaitFor(t, time.Second, "no backend waiting for the set", func() bool { return waiters(t, pool) == 0 })
			inPool := poolPIDs(t, pool)[uint32(waiter)]
			switch {
			case how == "deadline" && !inPool:
				t.Errorf("backend %d, whose wait the server refused at the deadline, is not in the pool: destroyed", waiter)
			case how == "deadline":
				if n := heldBy(t, ctx, pool, uint32(waiter)); n != 0 {
					t.Errorf("backend %d, back in the pool, holds %d advisory locks, want none", waiter, n)
				}
			case inPool:
				t.Errorf("backend %d, which held part of the set, is still in the pool", waiter)
			default:
				// The destroyed session exits and releases what it took.
				pgtest.WaitFor(t, 10*time.Second, "the destroyed backend to exit", func() bool { return !backendAlive(t, pool, uint32(waiter)) })
			}
			assertFree(t, ctx, l, without(set, held)...)
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			assertIdle(t, pool)
		})
	}
}

// A child process holds a set by LockAll and is killed (SIGKILL: no
// Unlock, no goodbye); a waiter here asking for an overlapping set gets
// all of it once the child is gone, and not before.
func TestLockAllAfterHolderProcessKilled(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := newPool(t, url, 4)
	l := newLocker(t, pool)
	ctx := testContext(t)
	childSet := []string{"proc-all/a", "proc-all/b", "proc-all/c"}
	mySet := []string{"proc-all/c", "proc-all/d", "proc-all/a"}

	cmd := helperCommand(ctx, url, helperHoldAll+"="+strings.Join(childSet, "\n"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "helper: holding\n" {
		t.Fatalf("helper said %q, %v; want it to hold the set\n%s", line, err, stderr.String())
	}

	type result struct {
		lk  *Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		lk, err := l.LockAll(ctx, mySet...)
		got <- result{lk, err}
	}()
	pgtest.WaitFor(t, 10*time.Second, "LockAll to wait for the child", func() bool { return waiters(t, pool) == 1 })
	select {
	case r := <-got:
		t.Fatalf("LockAll returned while the child holds the set: %v, %v", r.lk, r.err)
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	_ = cmd.Wait() // "signal: killed"
	killed = true
	// The kernel closes the child's sockets; its idle backends read the
	// end at once and exit, releasing its locks. 10s is generous.
	var r result
	select {
	case r = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("LockAll still waiting 10s after the child was killed")
	}
	if r.err != nil {
		t.Fatalf("LockAll after the child was killed: %v", r.err)
	}
	t.Logf("LockAll granted %v after the kill", time.Since(killedAt))
	if want := byKey(mySet...); !slices.Equal(r.lk.Names(), want) {
		t.Errorf("Names = %q, want %q", r.lk.Names(), want)
	}
	if n := heldBy(t, ctx, pool, r.lk.pid); n != len(mySet) {
		t.Errorf("the Lock's backend holds %d advisory locks, want %d", n, len(mySet))
	}
	if err := r.lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "no advisory lock left", func() bool { return advisoryLocks(t, pool) == 0 })
	assertIdle(t, pool)
}

// holdAll is the helper process's part in TestLockAllAfterHolderProcessKilled:
// it takes the set, says so on stdout, and holds it until it is killed (or
// its minute is up).
func holdAll(ctx context.Context, t *testing.T, l *Locker, names []string) {
	lk, err := l.LockAll(ctx, names...)
	if err != nil {
		t.Fatalf("helper: LockAll: %v", err)
	}
	fmt.Println("helper: holding")
	<-ctx.Done()
	_ = lk.Unlock(context.Background())
}

// A name given twice is taken once: one pg_locks row per key, and one
// Unlock releases it (a session lock taken twice would need two).
func TestLockAllDuplicateNames(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	want := byKey("dup/a", "dup/b")
	lk, err := l.LockAll(ctx, "dup/b", "dup/a", "dup/b", "dup/a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lk.Names(), want) || lk.Name() != strings.Join(want, ", ") || lk.Key() != Key(want[0]) || lk.Shared() {
		t.Errorf("Names, Name, Key, Shared = %q, %q, %d, %v", lk.Names(), lk.Name(), lk.Key(), lk.Shared())
	}
	if n := heldBy(t, ctx, pool, lk.pid); n != 2 {
		t.Errorf("the session holds %d advisory locks, want 2", n)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks after Unlock = %d, want 0", n)
	}

	// A set of one name is the Lock of that name.
	one, err := l.LockAll(ctx, "dup/a", "dup/a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(one.Names(), []string{"dup/a"}) || one.Name() != "dup/a" || one.Key() != Key("dup/a") {
		t.Errorf("Names, Name, Key = %q, %q, %d", one.Names(), one.Name(), one.Key())
	}
	_, err = l.TryLockAll(ctx, "dup/a", "dup/a")
	if want := fmt.Sprintf(`pglock: lock "dup/a" held by pid %d `, one.pid); !errors.Is(err, ErrLocked) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("TryLockAll of a held single name = %v, want a HeldError starting %q", err, want)
	}
	if err := one.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// In transaction scope the set is taken once too.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := XactLockAll(ctx, tx, "dup/b", "dup/a", "dup/b"); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&n); err != nil {
			return err
		}
		if n != 2 {
			t.Errorf("the transaction holds %d advisory locks, want 2", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	assertIdle(t, pool)
}

// Names that share a key (distinct names whose SHA-256 begins alike; none
// is known, so the key function is a stand-in) are held by one key: the
// set keeps both names and takes the key once.
func TestSetCollidingKeys(t *testing.T) {
	t.Parallel()
	key := func(n string) int64 {
		switch n {
		case "x", "y":
			return 7
		case "z":
			return -3
		}
		return Key(n)
	}
	s, err := newSetKeyed([]string{"y", "z", "x", "y"}, key)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"z", "x", "y"}; !slices.Equal(s.names, want) {
		t.Errorf("names = %q, want %q", s.names, want)
	}
	if want := []int64{-3, 7}; !slices.Equal(s.keys, want) {
		t.Errorf("keys = %d, want %d", s.keys, want)
	}
	if s.label() != "z, x, y" {
		t.Errorf("label = %q", s.label())
	}
}

// A set records as one lock: one wait and one hold, named by the set's
// label with WithNameAttribute, and a refused TryLockAll as locked.
func TestMetricsLockAll(t *testing.T) {
	t.Parallel()
	mr := metrictest.New(t)
	pool, l := setup(t, WithMeterProvider(mr.MP), WithNameAttribute(true))
	ctx := testContext(t)
	lk, err := l.LockAll(ctx, "m/a", "m/b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLockAll(ctx, "m/b", "m/c"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLockAll of a held set = %v, want ErrLocked", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got := mr.Collect(t)
	label := "name=" + lk.Name()
	if p := metrictest.Find(t, got, metricWait, "mode=exclusive,"+label+",outcome=acquired,try=false"); p.Count != 1 {
		t.Errorf("LockAll acquired waits = %d, want 1", p.Count)
	}
	refused := "name=" + strings.Join(byKey("m/b", "m/c"), ", ")
	if p := metrictest.Find(t, got, metricWait, "mode=exclusive,"+refused+",outcome=locked,try=true"); p.Count != 1 {
		t.Errorf("TryLockAll locked waits = %d, want 1", p.Count)
	}
	if p := metrictest.Find(t, got, metricHold, "mode=exclusive,"+label+",outcome=unlocked"); p.Count != 1 {
		t.Errorf("LockAll holds = %d, want 1", p.Count)
	}
	assertIdle(t, pool)
}

// TestLockAllBeyondTheLockTable (scenario: a set larger than what is left
// of PostgreSQL's shared lock table — max_locks_per_transaction ×
// (max_connections + max_prepared_transactions) slots, with some slack,
// shared by every session's locks). The acquire fails with SQLSTATE 53200
// ("out of shared memory") and takes nothing, over LockAll, TryLockAll and
// XactLockAll, keeping its session; a lock is granted after it. Its error
// quotes the set's first names only: it quoted every one, 440 KB for
// 50,000 names. A cluster of its own: filling the lock table fails other
// tests' locks meanwhile.
func TestLockAllBeyondTheLockTable(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.WithSetting("max_connections", "20"), pgtest.WithSetting("max_locks_per_transaction", "10"))
	pool := newPool(t, c.URL("postgres"), 4)
	l := newLocker(t, pool)
	ctx := testContext(t)
	var slots int
	if err := pool.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int
  * (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int)`).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 20*slots) // far past the slack: this cluster (200 slots) held 500 names, not 1,000
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
	}
	for _, op := range []struct {
		name string
		call func() error
	}{
		{"LockAll", func() error {
			lk, err := l.LockAll(ctx, names...)
			if err == nil {
				_ = lk.Unlock(ctx)
			}
			return err
		}},
		{"TryLockAll", func() error {
			lk, err := l.TryLockAll(ctx, names...)
			if err == nil {
				_ = lk.Unlock(ctx)
			}
			return err
		}},
		{"XactLockAll", func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			return XactLockAll(ctx, tx, names...)
		}},
	} {
		err := op.call()
		if pgerr.Code(err) != "53200" {
			t.Fatalf("%s of %d names (lock table %d slots): %.300v; want SQLSTATE 53200", op.name, len(names), slots, err)
		}
		if msg := err.Error(); len(msg) > 1000 || !strings.Contains(msg, fmt.Sprintf("and %d more", len(names)-maxShownNames)) {
			t.Errorf("%s: the error (%d bytes) does not stop at %d names: %.300s", op.name, len(msg), maxShownNames, msg)
		}
		// The failed acquire gave back what it took before it returned,
		// and kept its session (keep; a transaction rolls back): a
		// destroyed one frees its locks only as its backend exits, a
		// moment later, and meanwhile a new connection may itself fail
		// with 53200.
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&n); err != nil || n != 0 {
			t.Errorf("after %s failed: %d advisory locks held, %v; want none", op.name, n, err)
		}
	}
	if n := pool.Stat().NewConnsCount(); n != 1 {
		t.Errorf("the pool opened %d connections for the failed sets, want 1: their sessions were destroyed", n)
	}
	lk, err := l.Lock(ctx, "after")
	if err != nil {
		t.Fatalf("Lock after the failed sets: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	assertIdle(t, pool)
}
