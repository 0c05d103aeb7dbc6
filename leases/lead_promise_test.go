package leases

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The promise (Lead's doc; leases doc, "Requested hand-over"): when an
// operator requests a hand-over, the leader's fn context ends with cause
// ErrHandover, Lead releases once fn returns, and it campaigns again only
// after one TTL — so that the leadership leaves this candidate rather than
// bouncing straight back to it. With no other candidate, the lease then
// stays free for a TTL: the next grant, by the same Lead, comes at least
// one TTL after the release, both read from the database clock.
func TestLeadCampaignsAgainOnlyAfterATTL(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	op := newClient(t, pool)
	ctx := testContext(t)
	const ttl = 2 * time.Second
	// The pause is a local timer started after the release returned; the
	// database clock runs on the same machine. 100ms covers timer and
	// clock granularity, far below the TTL.
	const slack = 100 * time.Millisecond

	terms := make(chan *Lease)
	lctx, stop := context.WithCancel(ctx)
	led := make(chan error, 1)
	go func() {
		led <- c.Lead(lctx, "lead/pause", ttl, func(fctx context.Context, l *Lease) error {
			select {
			case terms <- l:
			case <-fctx.Done():
				return nil
			}
			<-fctx.Done()
			return nil
		})
	}()
	defer func() {
		stop()
		if err := <-led; err != nil {
			t.Errorf("Lead: %v", err)
		}
	}()
	var first *Lease
	select {
	case first = <-terms:
	case <-ctx.Done():
		t.Fatal("Lead never led")
	}
	if _, err := op.RequestHandover(ctx, "lead/pause", 10*time.Second); err != nil {
		t.Fatalf("RequestHandover: %v", err)
	}
	if !errors.Is(context.Cause(first.Context()), ErrHandover) {
		t.Errorf("the leader's context ended with %v, want ErrHandover", context.Cause(first.Context()))
	}
	var released time.Time
	if err := pool.QueryRow(ctx, `SELECT expires_at FROM pgfence.leases WHERE name = 'lead/pause' AND fence = $1`, first.Fence()).Scan(&released); err != nil {
		t.Fatalf("the released grant: %v", err)
	}
	var second *Lease
	select {
	case second = <-terms:
	case <-ctx.Done():
		t.Fatal("Lead never campaigned again")
	}
	var acquired time.Time
	if err := pool.QueryRow(ctx, `SELECT acquired_at FROM pgfence.leases WHERE name = 'lead/pause' AND fence = $1`, second.Fence()).Scan(&acquired); err != nil {
		t.Fatalf("the next grant: %v", err)
	}
	if gap := acquired.Sub(released); gap < ttl-slack {
		t.Errorf("Lead took the lease back %s after handing it over, want at least one TTL (%s)", gap, ttl)
	} else {
		t.Logf("the lease was free for %s after the hand-over (TTL %s)", gap, ttl)
	}
}
