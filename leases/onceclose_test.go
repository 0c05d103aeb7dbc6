package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Close while Once or OnceTx runs fn: the period is not recorded, and the
// call says that the client closed (ErrClosed), as every method of a closed
// Client does, whatever fn made of its context ending. Before, Once
// returned fn's context.Canceled, and OnceTx, whose fn returned nil once
// its context ended, the error of a commit under an ended context
// ("fencing: commit: timeout: context already done: context canceled"):
// a shutdown looked like a failure of the job or of the database.
func TestOnceReportsClose(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		once func(ctx context.Context, c *Client, in chan<- struct{}) (bool, error)
	}{
		{"Once, fn returns its context's error", func(ctx context.Context, c *Client, in chan<- struct{}) (bool, error) {
			return c.Once(ctx, "job", "p", time.Minute, func(ctx context.Context, l *Lease) error {
				close(in)
				<-ctx.Done()
				return ctx.Err()
			})
		}},
		{"OnceTx, fn returns nil", func(ctx context.Context, c *Client, in chan<- struct{}) (bool, error) {
			return c.OnceTx(ctx, "jobtx", "p", time.Minute, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
				close(in)
				<-ctx.Done()
				return nil
			})
		}},
		{"OnceTx, fn returns its context's error", func(ctx context.Context, c *Client, in chan<- struct{}) (bool, error) {
			return c.OnceTx(ctx, "jobtx2", "p", time.Minute, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
				close(in)
				<-ctx.Done()
				return ctx.Err()
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			ctx := testContext(t)
			c := newClient(t, pool)
			in := make(chan struct{})
			type result struct {
				ran bool
				err error
			}
			done := make(chan result, 1)
			go func() {
				ran, err := tc.once(ctx, c, in)
				done <- result{ran, err}
			}()
			select {
			case <-in:
			case <-ctx.Done():
				t.Fatal("fn did not run")
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			var r result
			select {
			case r = <-done:
			case <-ctx.Done():
				t.Fatal("the call did not return after Close")
			}
			if r.ran || !errors.Is(r.err, ErrClosed) {
				t.Errorf("after Close: (%v, %v); want (false, an error wrapping ErrClosed)", r.ran, r.err)
			}
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.once`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("%d periods recorded; want none", n)
			}
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE expires_at > clock_timestamp()`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("%d live grants after Close; want none", n)
			}
		})
	}
}
