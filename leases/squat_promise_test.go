package leases

import (
	"context"
	"testing"
	"time"
)

// The promise (docs/design.md, "Threat model"): "A role that holds a
// lease's wait key can only slow that lease's hand-over to polling (a
// waiter gives up on the key after 2 s, its lock_timeout, and polls)." So
// a squatter on one name's wait key must not cost a client's waiters on
// other names their notifications.
//
// Here client b waits for x, whose wait key a squatter holds exclusively,
// and for y. Its listener starts while x is wanted, so it must take x's
// key with y's. b polls once an hour and a holds both leases for a minute:
// only a notification hands y over within the bound.
func TestWaitKeySquatterSlowsOnlyItsLease(t *testing.T) {
	t.Parallel()
	cs, ps := clients(t, 2)
	a := cs[0]
	waiting := make(chan string)
	counted := make(chan struct{}) // closed: the test stops counting
	b := hookWait(newClient(t, ps[1], WithPollInterval(time.Hour)), func(name string) {
		if name == "squat/y" {
			select {
			case waiting <- name: // y's waiter goes to sleep: the test counts
			case <-counted:
			}
		}
	})
	ctx := testContext(t)
	squatter, err := ps[0].Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer squatter.Release()
	if _, err := squatter.Exec(ctx, `SELECT pg_advisory_lock(1885824613, $1)`, waitKey("squat/x")); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := squatter.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`); err != nil {
			t.Error(err)
		}
	}()
	ly, err := a.TryAcquire(ctx, "squat/y", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(ctx, "squat/x", time.Minute); err != nil {
		t.Fatal(err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	xDone := make(chan struct{})
	go func() {
		defer close(xDone)
		_, _ = b.Acquire(wctx, "squat/x", time.Minute) // ends with wctx
	}()
	defer func() { stop(); <-xDone }()
	pgtestWaitWanted(t, ctx, b, "squat/x")
	type taken struct {
		l   *Lease
		err error
	}
	got := make(chan taken, 1)
	go func() {
		l, err := b.Acquire(ctx, "squat/y", time.Minute)
		got <- taken{l, err}
	}()
	// Release y once b listens with y's wait key held, or, while b's
	// listener does not work, once y's waiter — which then polls backing
	// off from 50ms (pollDelay) — goes to sleep for the ninth time: with
	// no notification it would sleep at least 50ms<<8/2 = 6.4s.
	registered := func() bool {
		b.imu.Lock()
		_, held := b.in.held["squat/y"]
		b.imu.Unlock()
		b.mu.Lock()
		defer b.mu.Unlock()
		return held && b.listenOK
	}
	for n := 0; n < 9; {
		select {
		case <-waiting:
			n++
		case <-time.After(10 * time.Millisecond): // polling: registration announces nothing
		case <-ctx.Done():
			t.Fatal("y's waiter neither registered nor slept nine times")
		}
		if n > 0 && registered() {
			break
		}
	}
	close(counted)
	begin := time.Now()
	if err := ly.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// 4s: the 2s key wait twice over, below the 6.4s a poll would take,
	// far below y's poll interval (1h) and the grant's expiry (1 min).
	const bound = 4 * time.Second
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("y's waiter: %v", g.err)
		}
		t.Logf("y handed over in %s", time.Since(begin))
		if took := time.Since(begin); took > bound {
			t.Errorf("y's hand-over took %s with x's wait key squatted, want under %s", took, bound)
		}
	case <-time.After(bound): // the failure is the absence of the hand-over
		t.Fatalf("y's waiter was not handed y within %s of its release: a squatter on x's wait key cost y its notifications", bound)
	}
}

// pgtestWaitWanted waits until c has a waiter queued on name.
func pgtestWaitWanted(t *testing.T, ctx context.Context, c *Client, name string) {
	t.Helper()
	for {
		c.mu.Lock()
		wanted := c.wantedLocked(name)
		c.mu.Unlock()
		if wanted {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no waiter on %s", name)
		case <-time.After(10 * time.Millisecond): // polling: queues announce nothing
		}
	}
}
