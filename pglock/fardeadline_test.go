package pglock

import (
	"context"
	"testing"
	"time"
)

// A context whose deadline is further away than time.Duration reaches
// (about 292 years: a "never" sentinel such as year 9999) waits like one
// without a deadline. Before, the remaining time saturated at the largest
// Duration, rounding it up to the millisecond overflowed to a negative
// one, and the wait went to the server with a lock_timeout of 1ms: Lock
// failed at once with a lock timeout while the holder held the lock.
func TestFarDeadlineWaits(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "database/sql"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			pool, l := setup(t)
			if driver == "database/sql" {
				l = dbLocker(t, pool)
			}
			ctx := testContext(t)
			holder, err := newLocker(t, pool).Lock(ctx, "far")
			if err != nil {
				t.Fatal(err)
			}
			// Not derived from ctx: its deadline would be ctx's. Ended
			// with the test all the same.
			far, cancel := context.WithDeadline(context.Background(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
			defer cancel()
			stop := context.AfterFunc(ctx, cancel)
			defer stop()
			type result struct {
				lk  *Lock
				err error
			}
			got := make(chan result, 1)
			go func() {
				lk, err := l.Lock(far, "far")
				got <- result{lk, err}
			}()
			// The waiter waits: the holder lets go only once it shows.
			for waiters(t, pool) == 0 {
				select {
				case r := <-got:
					t.Fatalf("Lock with a deadline in year 9999 returned before the holder let go: %v", r.err)
				case <-ctx.Done():
					t.Fatalf("no wait for the lock showed on the server (%v): the server ended it at once, and Lock hangs", ctx.Err())
				case <-time.After(5 * time.Millisecond):
				}
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("Lock after the holder let go: %v", r.err)
			}
			if err := r.lk.Unlock(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}
