package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
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
	var nilSem *Semaphore
	fn := func(context.Context, *Lease) error { return nil }
	l, err := c.TryAcquire(testContext(t), "nil-input", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sem, err := c.Semaphore("nil-input-sem", 2)
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
		"Once": func() error { _, err := c.Once(nilCtx, "x", "p", time.Minute, fn); return err },
		"OnceTx": func() error {
			_, err := c.OnceTx(nilCtx, "x", "p", time.Minute, func(context.Context, pgx.Tx, *Lease) error { return nil })
			return err
		},
		"OnceDone":        func() error { _, _, err := c.OnceDone(nilCtx, "x", "p"); return err },
		"MarkDone nil tx": func() error { _, err := MarkDone(testContext(t), nil, "x", "p"); return err },
		"MarkDone typed nil tx": func() error {
			_, err := MarkDone(testContext(t), (*pgxpool.Tx)(nil), "x", "p")
			return err
		},
		"Semaphore Holders":     func() error { _, err := sem.Holders(nilCtx); return err },
		"Semaphore TryAcquire":  func() error { _, err := sem.TryAcquire(nilCtx, time.Minute); return err },
		"SetData":               func() error { return l.SetData(nilCtx, nil) },
		"Extend":                func() error { return l.Extend(nilCtx, time.Minute) },
		"nil lease SetData":     func() error { return nilLease.SetData(testContext(t), nil) },
		"nil lease Extend":      func() error { return nilLease.Extend(testContext(t), time.Minute) },
		"nil lease HoldAtLeast": func() error { return nilLease.HoldAtLeast(time.Second) },
		"nil client Close":      func() error { return nilClient.Close() },
		"nil client Once": func() error {
			_, err := nilClient.Once(testContext(t), "x", "p", time.Minute, fn)
			return err
		},
		"nil client OnceDone": func() error { _, _, err := nilClient.OnceDone(testContext(t), "x", "p"); return err },
		"nil client Semaphore Holders": func() error {
			s, err := nilClient.Semaphore("x", 2)
			if err != nil {
				return err
			}
			_, err = s.Holders(testContext(t))
			return err
		},
		"nil client TryAcquire": func() error { _, err := nilClient.TryAcquire(testContext(t), "x", time.Minute); return err },
		"nil client Get":        func() error { _, err := nilClient.Get(testContext(t), "x"); return err },
		"nil semaphore Acquire": func() error { _, err := nilSem.Acquire(testContext(t), time.Minute); return err },
		"nil semaphore TryAcquire": func() error {
			_, err := nilSem.TryAcquire(testContext(t), time.Minute)
			return err
		},
		"nil semaphore Run":     func() error { return nilSem.Run(testContext(t), time.Minute, fn) },
		"nil semaphore Holders": func() error { _, err := nilSem.Holders(testContext(t)); return err },
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

// A nil *Lease holds nothing and says so without panicking, as a nil
// pglock.Lock does: its Context has ended, Done is closed, Err is
// ErrInvalid, and the accessors return zero values.
func TestNilLeaseAccessors(t *testing.T) {
	t.Parallel()
	var l *Lease
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("panicked: %v", r)
		}
	}()
	if err := l.Err(); !errors.Is(err, ErrInvalid) {
		t.Errorf("Err = %v, want ErrInvalid", err)
	}
	select {
	case <-l.Done():
	default:
		t.Error("Done is not closed")
	}
	if err := context.Cause(l.Context()); !errors.Is(err, ErrInvalid) {
		t.Errorf("Context's cause = %v, want ErrInvalid", err)
	}
	if l.Name() != "" || l.Owner() != "" || l.Fence() != 0 || l.Slot() != 0 || l.TTL() != 0 ||
		!l.ExpiresAt().IsZero() || l.Data() != nil || l.Token() != (fencing.Token{}) || l.String() == "" {
		t.Error("a nil Lease reports something held")
	}
	if err := l.Token().Validate(); !errors.Is(err, fencing.ErrInvalid) {
		t.Errorf("its Token validates: %v", err)
	}
}
