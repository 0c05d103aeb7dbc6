package leases

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// fn returning, while still leader, an error that wraps ErrLost — of some
// other lease fn used, say — is fn's result: Lead releases and returns it,
// and does not take it for its own leadership lost and campaign again.
func TestLeadReturnsFnErrorWrappingErrLostWhileLeader(t *testing.T) {
	t.Parallel()
	c := newClient(t, pgtest.PoolFor(t, pgtest.URL(t)))
	ctx := testContext(t)
	errOther := fmt.Errorf("another lease: %w", ErrLost)
	errAgain := errors.New("fn ran a second time: Lead campaigned again")
	calls := 0
	err := c.Lead(ctx, "lead/fn-lost", 5*time.Second, func(ctx context.Context, l *Lease) error {
		calls++
		if calls > 1 {
			return errAgain
		}
		return errOther
	})
	if !errors.Is(err, errOther) || calls != 1 {
		t.Fatalf("Lead returned %v after %d calls of fn; want fn's error after 1", err, calls)
	}
}
