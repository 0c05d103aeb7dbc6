package leases

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// acquireHandover starts c.Acquire of "handover" (TTL 30s) in the
// background; its lease arrives on the channel returned (nil after an
// error, which fails t).
func acquireHandover(t *testing.T, ctx context.Context, c *Client) <-chan *Lease {
	got := make(chan *Lease, 1)
	go func() {
		l, err := c.Acquire(ctx, "handover", 30*time.Second)
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- l
	}()
	return got
}

// Hand-over on release takes a notification round trip, far below the
// poll interval: a waiter on another client (another replica) holds the
// lease soon after the holder releases it.
func TestHandoverFasterThanPolling(t *testing.T) {
	t.Parallel()
	const poll = 10 * time.Second
	cs, ps := clients(t, 2)
	a := cs[0]
	waiting := make(chan struct{}, 1)
	b := hookWait(newClient(t, ps[1], WithPollInterval(poll)), func(string) { signal(waiting) })
	ctx := testContext(t)
	// A 30s TTL: the waiter's wake-up at the holder's expiry stays out of
	// the way.
	la, err := a.TryAcquire(ctx, "handover", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitListening(t, b)
	got := acquireHandover(t, ctx, b)
	<-waiting // b tried once and sleeps
	begin := time.Now()
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-got
	took := time.Since(begin)
	t.Logf("hand-over across clients: %s (poll interval %s)", took, poll)
	// Generous bound for a loaded CI machine; typically a few ms.
	if took > 2*time.Second {
		t.Errorf("hand-over took %s, want far below the %s poll interval", took, poll)
	}
	if lb != nil && lb.Fence() <= la.Fence() {
		t.Errorf("fence %d after %d", lb.Fence(), la.Fence())
	}

	// Within one client the release wakes the local waiter directly.
	local := acquireHandover(t, ctx, b)
	<-waiting
	begin = time.Now()
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-local
	t.Logf("hand-over within a client: %s", time.Since(begin))
	if took := time.Since(begin); took > 2*time.Second {
		t.Errorf("local hand-over took %s", took)
	}
}

// Many waiters on one name in one client cost one attempt per wake-up:
// only the head of the queue talks to the database.
func TestWaitersDoNotStampede(t *testing.T) {
	t.Parallel()
	cs, ps := clients(t, 2)
	a := cs[0]
	var attempts atomic.Int32
	b := hookWait(newClient(t, ps[1], WithPollInterval(time.Hour)), func(string) { attempts.Add(1) })
	ctx := testContext(t)
	la, err := a.TryAcquire(ctx, "herd", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	waitListening(t, b)
	const waiters = 8
	var wg sync.WaitGroup
	var got atomic.Int32
	for range waiters {
		wg.Go(func() {
			l, err := b.Acquire(ctx, "herd", time.Minute)
			if err != nil {
				t.Errorf("Acquire: %v", err)
				return
			}
			got.Add(1)
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release: %v", err)
			}
		})
	}
	queued := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		if q := b.queues["herd"]; q != nil {
			return len(q.waiters)
		}
		return 0
	}
	pgtest.WaitFor(t, testTimeout, "every waiter to queue and the head to attempt", func() bool { return queued() == waiters && attempts.Load() >= 1 })
	// Five wake-ups while the lease is still held: notifications for the
	// name, as a release elsewhere would send.
	const wakeups = 5
	for range wakeups {
		if _, err := ps[0].Exec(ctx, "SELECT pg_notify('pgfence_leases', 'herd')"); err != nil {
			t.Fatal(err)
		}
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got.Load() != waiters {
		t.Errorf("%d of %d waiters got the lease", got.Load(), waiters)
	}
	// Only the head attempts: at most one failed attempt per wake-up, plus
	// for each hand-over one that may race the previous holder's release.
	// Every waiter attempting on every wake-up would cost over 40 here.
	n := attempts.Load()
	t.Logf("%d failed attempts in all for %d waiters and %d wake-ups", n, waiters, wakeups)
	if limit := int32(1 + wakeups + 2*waiters); n > limit {
		t.Errorf("%d failed attempts, want at most %d", n, limit)
	}
}

func TestObserve(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2, WithPollInterval(50*time.Millisecond))
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	octx, cancel := context.WithCancel(ctx)
	ch, err := b.Observe(octx, "watched")
	if err != nil {
		t.Fatal(err)
	}
	next := func() Info {
		t.Helper()
		select {
		case info, ok := <-ch:
			if !ok {
				t.Fatal("observe channel closed early")
			}
			return info
		case <-ctx.Done():
			t.Fatal("no change observed")
		}
		return Info{}
	}
	if info := next(); info.Owner != "" || info.Name != "watched" {
		t.Errorf("first value %+v, want nobody holding", info)
	}
	l, err := a.TryAcquire(ctx, "watched", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if info := next(); info.Owner != l.Owner() || info.Fence != l.Fence() {
		t.Errorf("after grant: %+v, want %v", info, l)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if info := next(); info.Owner != "" {
		t.Errorf("after release: %+v, want nobody holding", info)
	}
	cancel()
	for range ch {
	}
}

func TestRunReportsLoss(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	var cause error
	// The force-release runs under the test's context, not fn's: a's
	// client ends fn's context as soon as it hears of the loss (the
	// release's notification, or a renewal), which may be before b has
	// read the answer to its own statement. A TTL of 10s, not the least:
	// a grant of a second ran out on a loaded machine before the
	// force-release, or before the release that follows fn.
	const ttl = 10 * time.Second
	err := a.Run(ctx, "run", ttl, func(fctx context.Context, l *Lease) error {
		if err := b.ForceRelease(ctx, "run"); err != nil {
			t.Errorf("ForceRelease: %v", err)
		}
		<-fctx.Done()
		cause = context.Cause(fctx)
		return nil
	})
	if !errors.Is(err, ErrLost) || !errors.Is(cause, ErrLost) {
		t.Errorf("Run = %v (fn's cause %v), want ErrLost", err, cause)
	}
	boom := errors.New("boom")
	err = a.Run(ctx, "run", ttl, func(ctx context.Context, l *Lease) error { return boom })
	if !errors.Is(err, boom) || errors.Is(err, ErrLost) {
		t.Errorf("Run = %v, want fn's error alone", err)
	}
	if _, err := b.Get(ctx, "run"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after Run: Get = %v, want ErrNotHeld (released)", err)
	}
	// Run's fn sees the caller's cancellation too.
	rctx, cancel := context.WithCancel(ctx)
	err = a.Run(rctx, "run", ttl, func(ctx context.Context, l *Lease) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel = %v, want context.Canceled", err)
	}
	if _, err := b.Get(ctx, "run"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after a cancelled Run: Get = %v, want ErrNotHeld (released despite cancellation)", err)
	}
}

// TestHandoverAfterInterestLost (scenario: the interest connection, on
// which a client holds the wait keys of the names it waits for, closes:
// its backend was terminated, or a waiter's context ended during its
// statement — pgx closes the connection). Releases by other clients
// notify only whoever holds a key, so a client left without the
// connection was told of none any more, and its waiters fell back to the
// poll interval for good. The listener now starts again with a new pair,
// and a hand-over takes a notification round trip again.
func TestHandoverAfterInterestLost(t *testing.T) {
	t.Parallel()
	const poll = 10 * time.Second
	cs, ps := clients(t, 2)
	a := cs[0]
	waiting := make(chan struct{}, 1)
	b := hookWait(newClient(t, ps[1], WithPollInterval(poll)), func(string) { signal(waiting) })
	ctx := testContext(t)
	waitListening(t, b)
	b.imu.Lock()
	first := b.in.conn
	b.imu.Unlock()
	if _, err := ps[0].Exec(ctx, `SELECT pg_terminate_backend($1)`, first.PgConn().PID()); err != nil {
		t.Fatal(err)
	}
	la, err := a.TryAcquire(ctx, "handover", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireHandover(t, ctx, b)
	<-waiting // b tried once and sleeps
	// The listener is back with a new interest connection (the
	// first attempt above found the old one closed).
	pgtest.WaitFor(t, testTimeout, "a new interest connection", func() bool {
		b.imu.Lock()
		defer b.imu.Unlock()
		_, held := b.in.held["handover"]
		return b.in.conn != nil && b.in.conn != first && held
	})
	begin := time.Now()
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-got
	took := time.Since(begin)
	t.Logf("hand-over after the interest connection was lost: %s (poll interval %s)", took, poll)
	// Generous bound for a loaded CI machine; typically a few ms.
	if took > 2*time.Second {
		t.Errorf("hand-over took %s, want far below the %s poll interval", took, poll)
	}
}
