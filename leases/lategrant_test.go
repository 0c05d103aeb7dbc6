package leases

import (
	"errors"
	"testing"
)

// A grant whose answer arrives after its local deadline (request start +
// TTL − margin) — a server that stalls before it answers, a commit that
// waits for a synchronous standby — is no lease the caller may trust: by
// the database clock it may have expired, and another owner may hold it.
// TryAcquire must not hand it out as held. Before, it returned the lease
// with Err() nil; the deadline timer, already past, only cancelled it a
// moment later, on another goroutine. PostgreSQL is made slow with a row
// trigger on pgfence.leases that sleeps 1.5s after expires_at is set, for
// a TTL of 1s: the answer comes after the server's expiry itself.
func TestGrantAnsweredAfterDeadline(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION public.stall() RETURNS trigger LANGUAGE plpgsql AS
			$$BEGIN PERFORM pg_sleep(1.5); RETURN NEW; END$$;
		CREATE TRIGGER stall BEFORE INSERT OR UPDATE ON pgfence.leases
			FOR EACH ROW EXECUTE FUNCTION public.stall()`); err != nil {
		t.Fatal(err)
	}
	l, err := c.TryAcquire(ctx, "late", MinTTL)
	if err == nil {
		if lerr := l.Err(); lerr == nil {
			t.Fatalf("TryAcquire answered after the local deadline returned a lease that says it is held (fence %d)", l.Fence())
		}
		return
	}
	if !errors.Is(err, ErrLost) {
		t.Fatalf("TryAcquire answered after the local deadline: %v, want ErrLost", err)
	}
}
