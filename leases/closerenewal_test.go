package leases

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Close does not wait for a scheduled renewal that the server does not
// answer: the keepalive's statement runs under the client's shutdown, as
// every other goroutine of the Client does. Before, it ran under a
// timeout of its own, at least TTL/3, and Close waited for it: with a
// stalled server and a TTL of 45s, for 15s, past its release timeout.
// Here every update of pgfence.leases stalls (a row trigger sleeps a
// minute) once the lease is granted; the first scheduled renewal comes
// TTL/3 = 15s later, and Close, called while it stalls, must return
// within a few seconds: its release timeout (1s; the release waits for
// the row the stalled renewal locks), with room for a loaded machine.
func TestCloseDoesNotWaitForStalledRenewal(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*testTimeout)
	defer cancel()
	c, err := New(pool, WithReleaseTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() }) // its error is the stalled release's
	const ttl = 45 * time.Second
	if _, err := c.TryAcquire(ctx, "stalled", ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS
			$$BEGIN PERFORM pg_sleep(60); RETURN NEW; END$$;
		CREATE TRIGGER stall BEFORE UPDATE ON pgfence.leases
			FOR EACH ROW EXECUTE FUNCTION public.stall()`); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 2*testTimeout, "the scheduled renewal to stall", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND state = 'active' AND query = $1 AND wait_event = 'PgSleep'`, sqlRenewBatch).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	start := time.Now()
	_ = c.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v while a renewal stalled, want about the release timeout (1s)", took.Round(time.Millisecond))
	}
	if n := pgtest.Acquired(pool); n != 0 {
		t.Errorf("after Close: %d connections still acquired from the pool", n)
	}
}
