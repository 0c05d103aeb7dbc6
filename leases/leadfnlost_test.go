package leases

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
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

// fn failing with a stale-token error of its own — a fenced write under
// another lease that was taken over — while Once's lease is still held is
// fn's result too: before, Once read any stale error as its own record
// refused and ran fn again. Once and OnceTx, with a real stale error from
// the guard.
func TestOnceReturnsFnStaleErrorWhileHeld(t *testing.T) {
	t.Parallel()
	pool := pgtest.PoolFor(t, pgtest.URL(t))
	c := newClient(t, pool)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE other_effects (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if err := fencing.Protect(ctx, pool, "other_effects"); err != nil {
		t.Fatal(err)
	}
	// A token of "other" that a takeover made stale.
	old, err := c.TryAcquire(ctx, "once/other", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stale := old.Token()
	if err := c.ForceRelease(ctx, "once/other"); err != nil {
		t.Fatal(err)
	}
	if _, err := newClient(t, pool).TryAcquire(ctx, "once/other", time.Minute); err != nil {
		t.Fatal(err)
	}
	staleWrite := func(ctx context.Context) error {
		err := fencing.InTx(ctx, pool, stale, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO other_effects VALUES (1)`)
			return err
		})
		if !fencing.IsStale(err) {
			t.Errorf("the write under the taken-over token: %v, want a stale error", err)
		}
		return err
	}
	for _, tc := range []struct {
		name string
		once func(fn func(ctx context.Context) error) (bool, error)
	}{
		{"Once", func(fn func(ctx context.Context) error) (bool, error) {
			return c.Once(ctx, "once/fn-stale", "p", 5*time.Second, func(ctx context.Context, l *Lease) error { return fn(ctx) })
		}},
		{"OnceTx", func(fn func(ctx context.Context) error) (bool, error) {
			return c.OnceTx(ctx, "once/fn-stale-tx", "p", 5*time.Second, func(ctx context.Context, _ pgx.Tx, l *Lease) error { return fn(ctx) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			ran, err := tc.once(func(ctx context.Context) error {
				calls++
				if calls > 1 {
					return fmt.Errorf("fn ran a second time: %s took the lease again", tc.name)
				}
				return staleWrite(ctx)
			})
			if ran || !fencing.IsStale(err) || calls != 1 {
				t.Fatalf("%s returned (%v, %v) after %d calls of fn; want (false, fn's stale error) after 1", tc.name, ran, err, calls)
			}
		})
	}
}
