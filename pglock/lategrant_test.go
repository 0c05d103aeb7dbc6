package pglock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// heldAfterFuncs is a context that its test cancels, and whose AfterFunc
// callbacks start only once the test lets them (release): the window a
// standard context leaves between closing Done and starting them, which a
// loaded machine can stretch, held open. Its Done is its own, so
// context.AfterFunc uses its AfterFunc method.
type heldAfterFuncs struct {
	context.Context // values only
	done            chan struct{}
	release         chan struct{}
}

func newHeldAfterFuncs(t *testing.T, parent context.Context) (ctx *heldAfterFuncs, cancel, release func()) {
	c := &heldAfterFuncs{Context: parent, done: make(chan struct{}), release: make(chan struct{})}
	var cancelOnce, releaseOnce sync.Once
	cancel = func() { cancelOnce.Do(func() { close(c.done) }) }
	release = func() { releaseOnce.Do(func() { close(c.release) }) }
	t.Cleanup(func() { cancel(); release() })
	return c, cancel, release
}

func (c *heldAfterFuncs) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *heldAfterFuncs) Done() <-chan struct{}       { return c.done }

func (c *heldAfterFuncs) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

func (c *heldAfterFuncs) AfterFunc(f func()) (stop func() bool) {
	var once sync.Once
	go func() {
		<-c.done
		<-c.release
		once.Do(func() { go f() })
	}()
	return func() (stopped bool) {
		once.Do(func() { stopped = true })
		return stopped
	}
}

// A grant whose answer is read after ctx has ended, but before the
// callback ctx runs at its end has started, is given back like any grant
// that comes as ctx ends: Lock and LockAll return ctx's error and keep
// the session, which holds no lock. The window is held open (a context
// closes Done before it starts its callbacks): the waiter's context is
// cancelled while it waits, the holder then lets go, and the callbacks
// start only after the call has returned. Before the fix the call
// returned the lock, as once in CI (LockAll over database/sql, "granted,
// want context deadline exceeded").
func TestGrantReadAfterCtxEnded(t *testing.T) {
	t.Parallel()
	forEachAcquire(t, func(t *testing.T, set, dbsql bool) {
		testGrantAfterCtx(t, pgtest.URL(t), set, dbsql) // a database each: waiters counts its own
	})
}

func testGrantAfterCtx(t *testing.T, u string, set, dbsql bool) {
	ctx := testContext(t)
	name := "late/" + t.Name()
	names := []string{name}
	if set {
		names = append(names, freeBelow(t, name))
	}
	observer := newPool(t, u, 2)
	other := newLocker(t, observer)
	holder, err := other.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Unlock(ctx) }() // on a failure before the release below
	pool := newPool(t, u, 2)
	l, db, opened := lockerOn(t, pool, dbsql)

	wctx, cancel, release := newHeldAfterFuncs(t, ctx)
	done := lockAsync(ctx, wctx, l, names)
	if !pgtest.Poll(10*time.Second, func() bool { return waiters(t, observer) == 1 }) {
		t.Fatalf("the wait never queued (%d advisory waiters)", waiters(t, observer))
	}
	before := opened()
	cancel()
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	release()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%s%q = %v, want %v", lockOp(names), names, err, context.Canceled)
	}
	if n := opened(); n != before {
		t.Errorf("the late grant's wait opened %d connections, want 0 (its session was not kept)", n-before)
	}
	// The kept session is the one a new call gets: it holds nothing.
	if n, err := sessionLocks(ctx, pool, db); err != nil || n != 0 {
		t.Errorf("the wait's session holds %d advisory locks (%v), want 0", n, err)
	}
	assertFree(t, ctx, other, names...)
}
