package leases

import (
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestGrantAfterWaitKeepsItsTTL (scenario: a holder's grant expires while
// its fenced transaction stays open; the next holder's grant waits inside
// its statement for that transaction, here longer than the TTL). The
// server starts the new grant's TTL when the wait ends, so the local
// deadline must count from there too — not from when the request was sent,
// which left a lease whose Context had ended before Acquire returned it —
// and must still come before the server's expiry.
func TestGrantAfterWaitKeepsItsTTL(t *testing.T) {
	t.Parallel()
	url, pool, ctx := protectedWork(t)
	holder := namedConn(t, ctx, url, "holder")
	openExpiringFencedWrite(t, ctx, freeze(newClient(t, pool)), holder, MinTTL)

	const ttl = 2 * time.Second
	taker := freeze(newClient(t, pool))
	type result struct {
		l   *Lease
		err error
	}
	took := make(chan result, 1)
	go func() {
		l, err := taker.Acquire(ctx, "job", ttl)
		took <- result{l, err}
	}()
	pgtest.WaitFor(t, testTimeout, "the takeover to wait for the fence lock", func() bool {
		return grantRunning(t, ctx, pool, "advisory") > 0
	})
	// The fenced transaction stays open for longer than the new grant's
	// TTL: the scenario, not a synchronisation.
	time.Sleep(ttl + ttl/4)
	if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	r := <-took
	if r.err != nil {
		t.Fatalf("Acquire behind the fenced transaction: %v", r.err)
	}
	l := r.l
	taker.mu.Lock()
	left := time.Until(l.deadline)
	taker.mu.Unlock()
	// The answer comes within milliseconds of the grant; half the TTL is a
	// bound no scheduling delay of a loaded machine reaches.
	if left < ttl/2 {
		t.Fatalf("local deadline %s after Acquire returned (Context err %v), want about the TTL (%s) − margin (%s)",
			left, l.Context().Err(), ttl, margin(ttl))
	}
	t.Logf("local deadline %s after Acquire returned", left)

	// Frozen: nothing renews it, so the local deadline passes; by then the
	// server's expiry must still be ahead.
	<-l.Done()
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("Err = %v, want ErrLost at the local deadline", l.Err())
	}
	doneBeforeExpiry(t, ctx, pool, l)
}

// grantStart adds the server's wait to the time the request was sent, and
// no more than the round trip seen since.
func TestGrantStart(t *testing.T) {
	const ttl = 10 * time.Second
	sent := time.Now().Add(-3 * time.Second) // the answer took about 3s
	stmtAt := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		waited time.Duration // by the database clock
		min    time.Duration // of the result after sent
		max    time.Duration
	}{
		{"no wait", 0, 0, 0},
		{"clock stepped back", -time.Second, 0, 0},
		{"waited 2s", 2 * time.Second, 2 * time.Second, 2 * time.Second},
		{"waited longer than the round trip", time.Hour, 3 * time.Second, 4 * time.Second},
	} {
		got := grantStart(sent, stmtAt, stmtAt.Add(tc.waited+ttl), ttl).Sub(sent)
		if got < tc.min || got > tc.max {
			t.Errorf("%s: grantStart = sent + %s, want %s to %s", tc.name, got, tc.min, tc.max)
		}
	}
}
