package leases

import (
	"context"
	"errors"
	"testing"
	"time"
)

// recovered calls f and returns what it panicked with (nil if it did not),
// as an HTTP server's per-request recover does.
func recovered(f func()) (r any) {
	defer func() { r = recover() }()
	f()
	return nil
}

// fn panics under Run, Semaphore.Run, Once and Lead, and the panic is
// recovered further up (net/http does so per request). Each releases
// first, as pglock.Do does: a lease left held would be renewed by the
// keepalive for as long as the process lives, and no replica could ever
// take it. Lead also stops counting itself leader.
func TestRunReleasesWhenFnPanics(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	sem, err := a.Semaphore("panic-sem", 1)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(fn func(context.Context, *Lease) error){
		"Run": func(fn func(context.Context, *Lease) error) { _ = a.Run(ctx, "panic-run", time.Minute, fn) },
		"Semaphore.Run": func(fn func(context.Context, *Lease) error) {
			_ = sem.Run(ctx, time.Minute, fn)
		},
		"Once": func(fn func(context.Context, *Lease) error) {
			_, _ = a.Once(ctx, "panic-once", "p", time.Minute, fn)
		},
		"Lead": func(fn func(context.Context, *Lease) error) { _ = a.Lead(ctx, "panic-lead", time.Minute, fn) },
	}
	for what, call := range calls {
		var held *Lease
		r := recovered(func() {
			call(func(_ context.Context, l *Lease) error {
				held = l
				panic("fn panicked")
			})
		})
		if r != "fn panicked" || held == nil {
			t.Errorf("%s: recovered %v (fn ran: %v), want fn's panic to propagate", what, r, held != nil)
			continue
		}
		if !errors.Is(held.Err(), ErrReleased) {
			t.Errorf("%s: lease after fn panicked: %v, want released", what, held.Err())
		}
		if l, err := b.TryAcquire(ctx, held.Name(), time.Minute); err != nil {
			t.Errorf("%s: another client after fn panicked: %v, want the lease free", what, err)
		} else if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		a.mu.Lock()
		leading := len(a.leading)
		a.mu.Unlock()
		if leading != 0 {
			t.Errorf("%s: after fn panicked the client still leads %d elections", what, leading)
		}
	}
}
