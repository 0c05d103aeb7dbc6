package leases

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The promises of HoldAtLeast and the leases doc ("Failure handling"):
// Close ignores a minimum hold — it ends every grant it holds at once —
// while a Release under a minimum hold whose statement fails leaves the
// grant to expire after its TTL: neither the background end of failed
// releases nor Close cuts the minimum hold short.
func TestMinimumHoldAtCloseAndAfterAFailedRelease(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	live := func(name string, fence int64) bool {
		t.Helper()
		var ok bool
		err := pool.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE name = $1 AND fence = $2`, name, fence).Scan(&ok)
		if err != nil {
			t.Fatalf("read the grant of %s: %v", name, err)
		}
		return ok
	}

	held, err := c.TryAcquire(ctx, "hold/held", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	failed, err := c.TryAcquire(ctx, "hold/failed", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lease{held, failed} {
		if err := l.HoldAtLeast(time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := failed.Release(gone); !errors.Is(err, context.Canceled) {
		t.Fatalf("Release under an ended context = %v, want context.Canceled", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if live(held.Name(), held.Fence()) {
		t.Errorf("Close left the grant of %s, held under a minimum hold, live: Close ignores minimum holds", held.Name())
	}
	if !live(failed.Name(), failed.Fence()) {
		t.Errorf("the grant of %s, whose Release under a minimum hold failed, was ended: its minimum hold was cut short", failed.Name())
	}
}
