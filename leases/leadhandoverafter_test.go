package leases

import (
	"context"
	"errors"
	"testing"
	"time"
)

// leadReleaseHeld runs c.Lead on name with an fn that returns at once,
// having taken the lease's release turn: Lead's Release waits until the
// test receives from l.turn(). It returns the lease fn ran under, the count
// of fn's runs (read it after done) and Lead's result; a second run of fn
// returns "fn ran again".
func leadReleaseHeld(t *testing.T, ctx context.Context, c *Client, name string) (l *Lease, calls *int, done <-chan error) {
	t.Helper()
	returned := make(chan *Lease, 1)
	runs := 0
	result := make(chan error, 1)
	go func() {
		result <- c.Lead(ctx, name, 2*time.Second, func(ctx context.Context, l *Lease) error {
			runs++
			if runs > 1 {
				return errors.New("fn ran again")
			}
			l.turn() <- struct{}{} // Release waits until the test lets it go
			returned <- l
			return nil
		})
	}()
	select {
	case l = <-returned:
	case <-ctx.Done():
		t.Fatal("fn did not run")
	}
	return l, &runs, result
}

// Lead returns fn's result when fn returns while still leader; a hand-over
// request makes it step down and campaign again only if it ended fn's
// context before fn returned. A request that lands after fn returned, while
// Lead is releasing, is moot: the leader is stepping down anyway. Before,
// Lead judged by the lease's context once released, so such a request
// turned fn's return into a hand-over: Lead discarded fn's result, waited a
// TTL and campaigned again, running fn again. Here Release is held up (the
// test takes the lease's release turn) while the request is delivered.
func TestLeadReturnsFnResultDespiteLateHandover(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	l, calls, done := leadReleaseHeld(t, ctx, c, "leader")
	if _, err := pool.Exec(ctx, `SELECT * FROM pgfence.request_handover('leader')`); err != nil {
		t.Fatal(err)
	}
	// Deliver the request as the keepalive or a notification's recheck
	// would, with the lease still held: fn has returned, Release waits.
	l.renewMu.Lock()
	c.renewBatch(ctx, []renewal{{l, l.TTL()}}, lostRenewRejected)
	l.renewMu.Unlock()
	if !errors.Is(context.Cause(l.Context()), ErrHandover) {
		t.Fatalf("the hand-over request did not reach the lease (cause %v): the test tests nothing", context.Cause(l.Context()))
	}
	<-l.turn()
	select {
	case err := <-done:
		if err != nil || *calls != 1 {
			t.Errorf("Lead = %v, fn ran %d times; want fn's nil, fn run once", err, *calls)
		}
	case <-ctx.Done():
		t.Fatal("Lead did not return")
	}
}

// A loss that Lead learns of only when it releases, after fn returned as
// leader (here: force-released while Release waits, and delivered as the
// keepalive would), made Lead campaign again and run fn a second time for
// work fn had finished. Lead returns fn's result now, wrapping ErrLost.
func TestLeadReturnsFnResultDespiteLateLoss(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	l, calls, done := leadReleaseHeld(t, ctx, c, "late-loss")
	if _, err := pool.Exec(ctx, `SELECT pgfence.force_release('late-loss', 5000)`); err != nil {
		t.Fatal(err)
	}
	l.renewMu.Lock()
	c.renewBatch(ctx, []renewal{{l, l.TTL()}}, lostRenewRejected)
	l.renewMu.Unlock()
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("the loss did not reach the lease (Err %v): the test tests nothing", l.Err())
	}
	<-l.turn()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLost) || *calls != 1 {
			t.Errorf("Lead = %v, fn ran %d times; want ErrLost, fn run once", err, *calls)
		}
	case <-ctx.Done():
		t.Fatal("Lead did not return")
	}
}
