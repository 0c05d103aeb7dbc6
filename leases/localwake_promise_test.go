package leases

import (
	"testing"
	"time"
)

// The promise (leases doc, "Hand-over"): within one Client, "a release by
// the same Client wakes the head directly" — its waiter needs neither a
// notification nor a poll. Here the Client listens for nothing and polls
// once an hour, and the grant was for an hour: only the direct wake can
// hand the lease over within the test's timeout.
func TestReleaseWakesTheSameClientsWaiter(t *testing.T) {
	t.Parallel()
	sleeping := make(chan struct{}, 1)
	c, _ := setup(t, WithNotifications(false), WithPollInterval(time.Hour))
	hookWait(c, func(string) { signal(sleeping) })
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "local", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	type taken struct {
		l   *Lease
		err error
	}
	got := make(chan taken, 1)
	go func() {
		l, err := c.Acquire(ctx, "local", time.Hour)
		got <- taken{l, err}
	}()
	select {
	case <-sleeping: // the waiter waits for this client's own grant
	case <-ctx.Done():
		t.Fatal("the waiter never waited")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("the waiter: %v", g.err)
		}
		if g.l.Fence() <= l.Fence() {
			t.Errorf("the waiter's fence %d does not exceed the released %d", g.l.Fence(), l.Fence())
		}
	case <-ctx.Done():
		t.Fatal("the release did not wake the same client's waiter (it would poll in an hour)")
	}
}
