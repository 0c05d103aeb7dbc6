package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Nothing in the public API panics on a nil context or a nil receiver: each
// call returns ErrInvalid, and Release does not touch the lease first.
func TestNilContextAndReceiver(t *testing.T) {
	t.Parallel()
	c := newClient(t, pgtest.Pool(t))
	var nilCtx context.Context
	var nilClient *Client
	var nilLease *Lease
	fn := func(context.Context, *Lease) error { return nil }
	l, err := c.TryAcquire(testContext(t), "nil-input", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]func() error{
		"Acquire":         func() error { _, err := c.Acquire(nilCtx, "x", time.Minute); return err },
		"TryAcquire":      func() error { _, err := c.TryAcquire(nilCtx, "x", time.Minute); return err },
		"Run":             func() error { return c.Run(nilCtx, "x", time.Minute, fn) },
		"Lead":            func() error { return c.Lead(nilCtx, "x", time.Minute, fn) },
		"Get":             func() error { _, err := c.Get(nilCtx, "x"); return err },
		"List":            func() error { _, err := c.List(nilCtx); return err },
		"ForceRelease":    func() error { return c.ForceRelease(nilCtx, "x") },
		"Observe":         func() error { _, err := c.Observe(nilCtx, "x"); return err },
		"RequestHandover": func() error { _, err := c.RequestHandover(nilCtx, "x", time.Second); return err },
		"Renew":           func() error { return l.Renew(nilCtx) },
		"Release":         func() error { return l.Release(nilCtx) },
		"nil lease Renew": func() error { return nilLease.Renew(testContext(t)) },
		"nil lease Release": func() error {
			return nilLease.Release(testContext(t))
		},
		"nil client Close":      func() error { return nilClient.Close() },
		"nil client TryAcquire": func() error { _, err := nilClient.TryAcquire(testContext(t), "x", time.Minute); return err },
		"nil client Get":        func() error { _, err := nilClient.Get(testContext(t), "x"); return err },
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("panicked: %v", r)
				}
			}()
			if err := call(); !errors.Is(err, ErrInvalid) {
				t.Fatalf("= %v, want ErrInvalid", err)
			}
		})
	}
	if l.Err() != nil {
		t.Fatalf("the lease was touched by calls with bad input: %v", l.Err())
	}
}
