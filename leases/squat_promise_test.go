package leases

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The promise (docs/design.md, "Threat model"): "A role that holds a
// lease's wait key can only slow that lease's hand-over to polling." So
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
	squatWaitKey(t, ctx, ps[0], "squat/x")
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
	// 4s: below the 6.4s a poll would take,
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

// A role squatting one lease's wait key must not slow the Client's other
// names: the squatted lease's waiter, which cannot register, must not
// hold up the registration (and so the Acquire) of a waiter for another
// name. Each Acquire below is of a free name, which registers before its
// first attempt.
func TestWaitKeySquatterDelaysNoOtherAcquire(t *testing.T) {
	t.Parallel()
	cs, ps := clients(t, 2)
	a := cs[0]
	attempts := make(chan struct{}, 100)
	b := hookWait(newClient(t, ps[1], WithPollInterval(50*time.Millisecond)), func(name string) {
		if name == "squat/x" {
			select {
			case attempts <- struct{}{}:
			default:
			}
		}
	})
	ctx := testContext(t)
	squatWaitKey(t, ctx, ps[0], "squat/x")
	if _, err := a.TryAcquire(ctx, "squat/x", time.Minute); err != nil {
		t.Fatal(err)
	}
	waitListening(t, b)

	wctx, stop := context.WithCancel(ctx)
	xDone := make(chan struct{})
	go func() {
		defer close(xDone)
		_, _ = b.Acquire(wctx, "squat/x", time.Minute) // ends with wctx
	}()
	defer func() { stop(); <-xDone }()
	for range 2 { // x's waiter tries to register before each attempt
		select {
		case <-attempts:
		case <-ctx.Done():
			t.Fatal("x's waiter never waited")
		}
	}
	// A free name takes a round trip or three. x's waiter tries to
	// register before each of its attempts, 50ms apart; were it to wait
	// for its key (2s, the server's lock_timeout) holding up the other
	// registrations, an Acquire begun during that wait would take up to
	// 2s. Acquires back to back for 3s cover at least one such wait. 1s
	// leaves a loaded machine room.
	const bound = time.Second
	var slowest time.Duration
	start := time.Now()
	for i := 0; time.Since(start) < 3*time.Second; i++ {
		begin := time.Now()
		l, err := b.Acquire(ctx, fmt.Sprintf("free/%d", i), time.Minute)
		took := time.Since(begin)
		if err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, took)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if slowest > bound {
		t.Errorf("the slowest Acquire of a free name took %s while another name's wait key was squatted, want under %s", slowest, bound)
	}
}

// squatWaitKey holds name's wait key exclusively, as a hostile role may,
// on a connection of pool until the test ends.
func squatWaitKey(t *testing.T, ctx context.Context, pool *pgxpool.Pool, name string) {
	t.Helper()
	squatter, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := squatter.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`); err != nil {
			t.Error(err)
		}
		squatter.Release()
	})
	if _, err := squatter.Exec(ctx, `SELECT pg_advisory_lock(1885824613, $1)`, waitKey(name)); err != nil {
		t.Fatal(err)
	}
}
