package leases

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// Release is safe to call twice, also at once: two concurrent calls on a
// held lease both return nil. Before, the second call, finding the lease
// already releasing, ran its own release statement; when that one reached
// the server first, the first call found the grant gone and reported the
// lease lost (ErrLost, and a lost lease in the metrics). Which statement
// arrives first is up to the scheduler, so the test makes many pairs.
func TestReleaseTwiceConcurrently(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	ctx := testContext(t)
	for round := range 40 {
		l, err := c.TryAcquire(ctx, "twice", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		for i := range errs {
			wg.Go(func() {
				<-start
				errs[i] = l.Release(ctx)
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d: call %d of two concurrent Releases: %v, want nil", round, i+1, err)
			}
		}
	}
}

// Release under a context that has already ended still releases the
// lease locally (its Context ends with ErrReleased) and reports the
// context's error for the statement it could not run; the release turn
// that serialises concurrent calls is not raced against the context.
func TestReleaseWithEndedContextReleasesLocally(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	ctx := testContext(t)
	for round := range 20 {
		l, err := c.TryAcquire(ctx, "ended", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		if err := l.Release(ended); !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: Release under an ended context: %v, want context.Canceled", round, err)
		}
		if err := l.Err(); !errors.Is(err, ErrReleased) {
			t.Fatalf("round %d: after Release under an ended context, Err() = %v, want ErrReleased", round, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("round %d: second Release: %v", round, err)
		}
	}
}
