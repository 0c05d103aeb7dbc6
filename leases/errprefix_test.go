package leases

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Every error the package returns reads "leases: ..." once: the package's
// name first, not twice in a row, whatever path made it — a client closed
// under a waiting call, a loss found by a renewal, the local deadline, a
// hand-over request, a call made with a lost lease's context.
func TestErrorsHaveThePrefix(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	client := func() *Client { return newClient(t, pgtest.PoolFor(t, url)) } // each its own pool
	a, op := client(), client()
	ctx := testContext(t)
	wait := func(what string, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		}
	}
	check := func(what string, err error, want error) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: no error", what)
		case !errors.Is(err, want):
			t.Errorf("%s: %v, want %v", what, err, want)
		case !strings.HasPrefix(err.Error(), "leases: "), strings.HasPrefix(err.Error(), "leases: leases: "):
			t.Errorf("%s: %q, want it to start with \"leases: \" once", what, err)
		}
	}

	_, err := op.Get(ctx, "nobody")
	check("Get of a free lease", err, ErrNotHeld)

	// Renew, Err, Release and SetData after a force-release.
	l, err := a.TryAcquire(ctx, "broken", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := op.ForceRelease(ctx, "broken"); err != nil {
		t.Fatal(err)
	}
	check("Renew after a force-release", l.Renew(ctx), ErrLost)
	check("Err after a loss", l.Err(), ErrLost)
	check("SetData after a loss", l.SetData(ctx, json.RawMessage(`1`)), ErrLost)
	check("Release after a loss", l.Release(ctx), ErrLost)
	_, err = a.Get(l.Context(), "broken")
	check("Get with a lost lease's context", err, ErrLost)

	// Extend, SetData and Release of a grant that expired unnoticed.
	for _, tc := range []struct {
		what string
		call func(l *Lease) error
	}{
		{"Extend", func(l *Lease) error { return l.Extend(ctx, time.Minute) }},
		{"SetData", func(l *Lease) error { return l.SetData(ctx, json.RawMessage(`1`)) }},
		{"Release", func(l *Lease) error { return l.Release(ctx) }},
	} {
		f := freeze(client())
		l, err := f.TryAcquire(ctx, "expired/"+tc.what, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		pause(f, l)
		waitExpired(t, op.pool, l.Name())
		check(tc.what+" of an expired grant", tc.call(l), ErrLost)
	}

	// The local deadline.
	f := freeze(client())
	l, err = f.TryAcquire(ctx, "deadline", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	wait("the local deadline", l.Done())
	check("Err after the local deadline", l.Err(), ErrLost)

	// A hand-over request: the lease's cause while it is still held.
	waitListening(t, a)
	l, err = a.TryAcquire(ctx, "asked", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = op.RequestHandover(ctx, "asked", 100*time.Millisecond)
	check("RequestHandover timed out", err, ErrHandoverTimeout)
	wait("the hand-over request to reach the holder", l.Done())
	check("Err after a hand-over request", l.Err(), ErrHandover)
	check("Context cause after a hand-over request", context.Cause(l.Context()), ErrHandover)

	// A client closed under calls that wait: RequestHandover, Acquire.
	c := client()
	waiting := make(chan struct{}, 1)
	hookWait(c, func(string) { signal(waiting) })
	handover := make(chan error, 1)
	go func() { _, err := c.RequestHandover(ctx, "asked", time.Minute); handover <- err }()
	acquire := make(chan error, 1)
	go func() { _, err := c.Acquire(ctx, "asked", time.Minute); acquire <- err }()
	wait("Acquire to wait", waiting)
	waitObserved(t, c, "asked")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	check("RequestHandover when the client closes", <-handover, ErrClosed)
	check("Acquire when the client closes", <-acquire, ErrClosed)

	// Once whose record of the period is cut short (fencing's error).
	cctx, cancel := context.WithCancel(ctx)
	_, err = op.Once(cctx, "once", "p1", time.Minute, func(context.Context, *Lease) error { cancel(); return nil })
	check("Once whose record is cut short", err, context.Canceled)

	// A grant whose answer arrives after Close.
	_, err = c.granted(ctx, Info{Name: "late", Owner: c.newOwner(), Fence: 1}, time.Minute, time.Now(), "", 0, nil)
	check("a grant after Close", err, ErrClosed)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitObserved waits until c observes the named lease.
func waitObserved(t *testing.T, c *Client, name string) {
	t.Helper()
	pgtest.WaitFor(t, testTimeout, name+" to be observed", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.observers[name]) > 0
	})
}
