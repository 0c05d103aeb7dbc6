package leases

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The promise (leases doc, "Leader election" and "Failure handling"): Lead
// keeps a listener, so a leader notices at once — about a round trip, not
// at its next renewal (TTL/3) — when its lease is released under it by a
// force-release on another client. TestLeadAtMostOneLeader bounds that
// by the TTL, which a leader without a listener meets too.
func TestLeadNoticesForceReleaseAtOnce(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	op := newClient(t, pool)
	ctx := testContext(t)
	// The next renewal is TTL/3 = 20s after the grant; notice must come
	// long before. 10s is far above a round trip on two loaded cores and
	// still well below 20s.
	const ttl = time.Minute
	const bound = 10 * time.Second

	lctx, stop := context.WithCancel(ctx)
	defer stop()
	leading := make(chan *Lease, 1)
	ended := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- c.Lead(lctx, "lead/force", ttl, func(fctx context.Context, l *Lease) error {
			select {
			case leading <- l:
			default:
				return nil // led again after the force-release: enough
			}
			<-fctx.Done()
			ended <- context.Cause(fctx)
			<-lctx.Done()
			return nil
		})
	}()
	defer func() {
		stop()
		<-done
	}()
	select {
	case <-leading:
	case <-ctx.Done():
		t.Fatal("Lead never led")
	}
	// Lead's own listener (not one this test starts) must be up before the
	// force-release, or its notification would reach nobody.
	select {
	case <-c.hooks.listening:
	case <-ctx.Done():
		t.Fatal("Lead's listener never listened")
	}
	start := time.Now()
	if err := op.ForceRelease(ctx, "lead/force"); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-ended:
		if took := time.Since(start); took > bound {
			t.Errorf("the force-released leader's fn ran on for %s, want under %s (its next renewal is at %s)", took, bound, ttl/3)
		} else {
			t.Logf("the leader learned in %s", took)
		}
		if !errors.Is(cause, ErrLost) {
			t.Errorf("fn's context ended with %v, want ErrLost", cause)
		}
	case <-time.After(bound): // no event to wait for: the failure is its absence
		t.Fatalf("the force-released leader's fn still runs after %s (its next renewal is at %s)", bound, ttl/3)
	}
}
