package leases

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A request made while the holder's client did not listen yet reaches the
// holder as soon as it listens, not at its next renewal. Lead starts its
// listener as it campaigns, and on a loaded machine LISTEN can complete
// after the grant and after an operator's hand-over request (seen in CI:
// a hand-over took 4.9s, the leader's TTL/3). The notification is lost;
// the request is in the row. So when the listener starts listening it has
// every held lease renewed at once, as it wakes every waiter.
//
// TTL 30s: the holder's next renewal is 10s away; the bound, 5s, is far
// above the round trips the recheck takes, and below that renewal.
func TestRequestBeforeListening(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		ask  func(ctx context.Context, op *Client, name string) error
		want error
	}{
		{"hand-over", func(ctx context.Context, op *Client, name string) error {
			_, err := op.RequestHandover(ctx, name, 20*time.Second) // returns once released
			return err
		}, ErrHandover},
		{"force-release", func(ctx context.Context, op *Client, name string) error {
			return op.ForceRelease(ctx, name)
		}, ErrLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cs, pools := clients(t, 2)
			a, op := cs[0], cs[1]
			ctx := testContext(t)
			name := "unheard/" + c.name
			l, err := a.TryAcquire(ctx, name, 30*time.Second) // a does not listen
			if err != nil {
				t.Fatal(err)
			}
			asked := make(chan error, 1)
			go func() { asked <- c.ask(ctx, op, name) }()
			waitFor(t, pools[0], `SELECT NOT EXISTS (SELECT FROM pgfence.leases
				WHERE name = $1 AND handover_fence IS DISTINCT FROM fence AND expires_at > clock_timestamp())`, name)

			start := time.Now()
			waitListening(t, a)
			select {
			case <-l.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the holder's context did not end within 20s")
			}
			took := time.Since(start)
			t.Logf("the holder learned of the %s %s after its client listened", c.name, took.Round(time.Millisecond))
			if !errors.Is(l.Err(), c.want) {
				t.Errorf("holder's cause: %v, want %v", l.Err(), c.want)
			}
			if took > 5*time.Second {
				t.Errorf("the holder learned of the %s %s after its client listened, want well within 5s (its next renewal: 10s after the grant)", c.name, took)
			}
			if err := l.Release(ctx); err != nil && !errors.Is(err, ErrLost) {
				t.Errorf("Release: %v", err)
			}
			if err := <-asked; err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		})
	}
}
