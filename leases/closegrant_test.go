package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Close cuts short a grant in flight, as the end of its caller's context
// would (settle.go), and waits for it: when Close returns, the grant is
// over (cancelled, or committed and ended again), its connection is back
// in the pool, and the call returns ErrClosed. Before, Close returned at
// once while the grant's statement ran on: a connection still acquired,
// and a grant that might commit after Close, held until its TTL if the
// caller's process ended meanwhile. PostgreSQL is made slow: a row trigger
// on pgfence.leases sleeps until the test lets it go.
func TestCloseCutsShortGrantInFlight(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `
		CREATE TABLE public.stall (on_ boolean NOT NULL);
		INSERT INTO public.stall VALUES (false);
		CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS
			$$BEGIN
				WHILE (SELECT on_ FROM public.stall) LOOP PERFORM pg_sleep(0.05); END LOOP;
				RETURN NEW;
			END$$;
		CREATE TRIGGER stall BEFORE INSERT OR UPDATE ON pgfence.leases
			FOR EACH ROW EXECUTE FUNCTION public.stall()`); err != nil {
		t.Fatal(err)
	}
	stall := func(on bool) {
		if _, err := pool.Exec(context.Background(), `UPDATE public.stall SET on_ = $1`, on); err != nil {
			t.Error(err)
		}
	}
	// stalled starts take on a new client, under ctx, and returns the
	// client and the call's outcome once the grant stalls.
	stalled := func(t *testing.T, ctx context.Context, take func(context.Context, *Client) (*Lease, error)) (*Client, <-chan taken) {
		c, err := New(pool, WithReleaseTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		stall(true)
		done := make(chan taken, 1)
		go func() {
			l, err := take(ctx, c)
			done <- taken{l, err}
		}()
		pgtest.WaitFor(t, testTimeout, "the grant to stall", func() bool {
			return grantRunning(t, ctx, pool, "PgSleep") > 0
		})
		return c, done
	}
	// wantClosed lets a grant that Close left running end (stall off), and
	// checks that its call, what, returned ErrClosed and no lease.
	wantClosed := func(t *testing.T, done <-chan taken, what string) {
		stall(false)
		var r taken
		select {
		case r = <-done:
		case <-ctx.Done():
			t.Fatal("the grant did not return")
		}
		if r.l != nil || !errors.Is(r.err, ErrClosed) {
			t.Errorf("%s: lease %v, error %v; want ErrClosed", what, r.l, r.err)
		}
	}
	for _, tk := range takes {
		t.Run(tk.name, func(t *testing.T) {
			c, done := stalled(t, ctx, tk.take)
			start := time.Now()
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			// Close sends a cancel request and waits for its answer, up
			// to the release timeout (1s); 10s leaves room for a loaded
			// machine.
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("Close took %v, want about a round trip", took)
			}
			if n := pgtest.Acquired(pool); n != 0 {
				t.Errorf("after Close: %d connections still acquired (the grant's)", n)
			}
			wantClosed(t, done, tk.name+" cut short by Close")
		})
	}
	// Under a context that never ends, the grant keeps its fast path:
	// Close does not wait for it, and the grant, committed once the server
	// answers, is ended and the call returns ErrClosed.
	t.Run("TryAcquire under context.Background", func(t *testing.T) {
		c, done := stalled(t, context.Background(), func(ctx context.Context, c *Client) (*Lease, error) {
			return c.TryAcquire(ctx, "background", time.Minute)
		})
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := grantRunning(t, ctx, pool, "PgSleep"); n == 0 {
			t.Errorf("the grant under context.Background stopped at Close; want it left to run")
		}
		wantClosed(t, done, "grant committed after Close")
		var live bool
		if err := pool.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE name = 'background'`).Scan(&live); err != nil || live {
			t.Errorf("lease row after the grant was ended: live %v, %v; want it ended", live, err)
		}
		if n := pgtest.Acquired(pool); n != 0 {
			t.Errorf("%d connections still acquired", n)
		}
	})
}
