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

// The same for Once: fn failing with an error that wraps ErrLost of
// something else, while the job's lease is held, is fn's failure, returned
// as (false, err); Once does not take the lease again and rerun fn.
func TestOnceReturnsFnErrorWrappingErrLostWhileHeld(t *testing.T) {
	t.Parallel()
	c := newClient(t, pgtest.PoolFor(t, pgtest.URL(t)))
	ctx := testContext(t)
	errOther := fmt.Errorf("another lease: %w", ErrLost)
	calls := 0
	ran, err := c.Once(ctx, "once/fn-lost", "2026-12-04", 5*time.Second, func(ctx context.Context, l *Lease) error {
		calls++
		if calls > 1 {
			return errors.New("fn ran a second time: Once took the lease again")
		}
		return errOther
	})
	if ran || !errors.Is(err, errOther) || calls != 1 {
		t.Fatalf("Once returned (%v, %v) after %d calls of fn; want (false, fn's error) after 1", ran, err, calls)
	}
}
