package leases

import (
	"context"
	"fmt"
	"testing"
	"time"
)

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
