package leases

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSuspendLosesByWallClock (scenario: the holder's machine is
// suspended for longer than the TTL — a laptop's lid, a hibernated virtual
// machine). Go's monotonic clock, which the local deadline is measured on,
// stops while the system sleeps on Linux (golang/go#24595); the wall clock
// goes on. Without a check of the wall clock the lease stayed held after
// the resume, its Context open, until the monotonic clock reached the
// deadline — up to the whole TTL — while the server had expired it and
// could grant it to another. The suspend is simulated by moving the wall
// clock the client reads (hooks.wallSkew): the test cannot suspend the
// machine it runs on.
func TestSuspendLosesByWallClock(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	freeze(c)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "job", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.TryAcquire(ctx, "other", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	c.hooks.wallSkew = 2 * time.Hour
	c.mu.Unlock()
	// The wall clock is checked every second (wallCheck); ten is a bound
	// no scheduling delay reaches.
	for _, l := range []*Lease{l, other} {
		select {
		case <-l.Done():
		case <-time.After(10 * wallCheck):
			t.Fatalf("lease %q still held %s after the wall clock passed its deadline", l.Name(), 10*wallCheck)
		}
		if !errors.Is(l.Err(), ErrLost) || !strings.Contains(l.Err().Error(), "wall clock") {
			t.Errorf("Err = %v, want ErrLost by the wall clock", l.Err())
		}
	}
}
