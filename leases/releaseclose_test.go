package leases

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A Release whose statement fails leaves the grant to the Client to end
// ("Close does, if it comes first"). When it fails after Close has begun,
// neither the keepalive (stopped) nor Close (which ends what it holds, and
// no longer holds a lease being released) ends it: before, the grant
// stayed live until its TTL, a minute here, though the client had closed
// and its holder gave it up. The release is made slow (a row trigger
// sleeps while the test says so) and its context ends after Close has
// returned.
func TestReleaseFailingAfterCloseEndsGrant(t *testing.T) {
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
		CREATE TRIGGER stall BEFORE UPDATE ON pgfence.leases
			FOR EACH ROW EXECUTE FUNCTION public.stall()`); err != nil {
		t.Fatal(err)
	}
	stall := func(on bool) {
		if _, err := pool.Exec(context.Background(), `UPDATE public.stall SET on_ = $1`, on); err != nil {
			t.Error(err)
		}
	}
	c := newClient(t, pool)
	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stall(true)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- l.Release(rctx) }()
	pgtest.WaitFor(t, testTimeout, "the release to stall", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event = 'PgSleep' AND query LIKE '%pgfence.release(%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	cancel() // the release fails, after Close began
	stall(false)
	select {
	case err := <-released:
		if err == nil {
			t.Fatal("Release succeeded: the test tests nothing")
		}
	case <-ctx.Done():
		t.Fatal("Release did not return")
	}
	var live bool
	if err := pool.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE name = 'job'`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live {
		t.Error("the grant is still live after Close and a failed Release; want it ended")
	}
}
