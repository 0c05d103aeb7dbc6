package leases

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/slogtest"
)

// A log handler that stalls must not hold the Client's lock: the deadline
// rule (a lease's Context ends at its local deadline, before anyone else
// can be granted it) must hold for the Client's other leases however long
// a log call takes. The keepalive logs the hand-over request it finds in a
// renewal; with that call stuck, nothing renews the other lease, whose
// Context must then end at its local deadline.
func TestStalledLoggerKeepsDeadlines(t *testing.T) {
	t.Parallel()
	h := slogtest.NewStalling("hand-over requested; stepping down")
	c, pool := setup(t, WithLogger(slog.New(h)), WithNotifications(false))
	t.Cleanup(func() { h.Release() }) // before Close, which waits for the keepalive
	ctx := testContext(t)

	asked, err := c.TryAcquire(ctx, "asked", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.TryAcquire(ctx, "other", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT * FROM pgfence.request_handover($1)`, asked.Name()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Stalled(): // the keepalive found the request (within TTL/3) and logs it
	case <-ctx.Done():
		t.Fatal("the keepalive did not log the hand-over request")
	}
	// Nothing renews other while the keepalive is stuck in the log call:
	// its Context must end by its local deadline (TTL − TTL/10 after its
	// last renewal, so within 2.7s). 15s leaves a loaded machine room.
	select {
	case <-other.Done():
	case <-time.After(15 * time.Second):
		// (Not ExpiresAt, which takes the lock the log call may hold.)
		t.Fatalf("lease %q still looks held 15s into a stalled log call, past its TTL of 3s", other.Name())
	}
}

// Leases lost together are all lost before anything is logged: a log call
// that stalls on the first loss must not leave the next lease's Context
// open past its deadline. Both leases pass their deadlines in one check
// (the wall clock moved past them, as after a suspend).
func TestStalledLoggerLosesEveryLease(t *testing.T) {
	t.Parallel()
	h := slogtest.NewStalling("leases: lease lost")
	c, _ := setup(t, WithLogger(slog.New(h)))
	t.Cleanup(func() { h.Release() }) // before Close, which waits for the deadline timer
	freeze(c)
	ctx := testContext(t)
	var held []*Lease
	for _, name := range []string{"first", "second"} {
		l, err := c.TryAcquire(ctx, name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	c.mu.Lock()
	c.hooks.wallSkew = 2 * time.Hour
	c.mu.Unlock()
	// The wall clock is checked every second (wallCheck); fifteen leave
	// a loaded machine room.
	for _, l := range held {
		select {
		case <-l.Done():
		case <-time.After(15 * wallCheck):
			t.Fatalf("lease %q still looks held %s after the wall clock passed its deadline, while a log call stalls",
				l.Name(), 15*wallCheck)
		}
	}
}

// The same for leases that one batched renewal finds gone: every one is
// lost when the renewal finds it gone, not only the first, the others
// waiting for their local deadlines while the first loss's log call
// stalls.
func TestStalledLoggerLosesEveryRenewal(t *testing.T) {
	t.Parallel()
	const ttl = 15 * time.Second // renewed after 5s; local deadline 13.5s
	h := slogtest.NewStalling("leases: lease lost")
	c, pool := setup(t, WithLogger(slog.New(h)), WithNotifications(false))
	t.Cleanup(func() { h.Release() }) // before Close, which waits for the keepalive
	ctx := testContext(t)
	granted := time.Now()
	var held []*Lease
	for _, name := range []string{"first", "second"} {
		l, err := c.TryAcquire(ctx, name, ttl)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	// Both grants end behind the holder's back (the test owns the table);
	// the keepalive's next batched renewal, TTL/3 after the grants, finds
	// neither.
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = clock_timestamp() WHERE name IN ('first', 'second')`); err != nil {
		t.Fatal(err)
	}
	// Both must end with that renewal (5s), well before their local
	// deadlines (13.5s), which would end them in any case: 11s leaves a
	// loaded machine 6s for the renewal.
	for _, l := range held {
		select {
		case <-l.Done():
		case <-time.After(time.Until(granted.Add(11 * time.Second))):
			t.Fatalf("lease %q still looks held 11s after its grant, though the renewal at 5s found it gone, while a log call stalls", l.Name())
		}
	}
}

// A waiter that could not register its interest logs that at Debug; a log
// handler that stalls there must not hold up the registration, and so the
// Acquire, of a waiter for another name.
func TestStalledLoggerLetsOthersRegister(t *testing.T) {
	t.Parallel()
	h := slogtest.NewStalling("could not register as waiter")
	c, pool := setup(t, WithLogger(slog.New(h)))
	t.Cleanup(func() { h.Release() }) // before Close, which waits for the waiters
	ctx := testContext(t)
	waitListening(t, c)
	// Another session holds "blocked"'s wait key exclusively: a waiter's
	// registration fails, and is logged.
	blocker, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Release()
	if _, err := blocker.Exec(ctx, `SELECT pg_advisory_lock(1885824613, $1)`, waitKey("blocked")); err != nil {
		t.Fatal(err)
	}
	go func() {
		// Its error is beside the point: it ends when the test does.
		if l, err := c.Acquire(ctx, "blocked", time.Minute); err == nil {
			_ = l.Release(context.Background())
		}
	}()
	select {
	case <-h.Stalled():
	case <-ctx.Done():
		t.Fatal("the failed registration was not logged")
	}
	// A free name is granted at once: its waiter registers first (want,
	// before the attempt). 10s leaves a loaded machine room.
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		l, err := c.Acquire(actx, "free", time.Minute)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Acquire of a free name: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Acquire of a free name, with a 10s deadline, has not returned in 15s while another waiter's log call stalls")
	}
}

// A renewal that finds one lease asked to hand over and another gone ends
// the gone one before it logs the request: a log call that stalls on the
// request must not keep the lost lease looking held.
func TestStalledHandoverLogLosesRenewal(t *testing.T) {
	t.Parallel()
	const ttl = 15 * time.Second // renewed after 5s; local deadline 13.5s
	h := slogtest.NewStalling("hand-over requested; stepping down")
	c, pool := setup(t, WithLogger(slog.New(h)), WithNotifications(false))
	t.Cleanup(func() { h.Release() }) // before Close, which waits for the keepalive
	ctx := testContext(t)
	granted := time.Now()
	if _, err := c.TryAcquire(ctx, "asked", ttl); err != nil {
		t.Fatal(err)
	}
	gone, err := c.TryAcquire(ctx, "gone", ttl)
	if err != nil {
		t.Fatal(err)
	}
	// One grant is asked to hand over, the other ends behind the holder's
	// back (the test owns the table); the keepalive's next batched
	// renewal, TTL/3 after the grants, finds both.
	if _, err := pool.Exec(ctx, `SELECT * FROM pgfence.request_handover('asked')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = clock_timestamp() WHERE name = 'gone'`); err != nil {
		t.Fatal(err)
	}
	// It must end with that renewal (5s), well before its local deadline
	// (13.5s): 11s leaves a loaded machine 6s for the renewal.
	select {
	case <-gone.Done():
	case <-time.After(time.Until(granted.Add(11 * time.Second))):
		t.Fatalf("lease %q still looks held 11s after its grant, though the renewal at 5s found it gone, while the log of a hand-over request stalls", gone.Name())
	}
}
