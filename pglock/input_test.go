package pglock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// Every bad input of the public API returns an error matching ErrInvalid,
// whose text names the argument and why, before anything is taken; none
// panics, whatever is nil.
func TestBadInputIsInvalid(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var (
		nilLocker *Locker
		nilCtx    context.Context
		nilTx     pgx.Tx
		typedNil  pgx.Tx = (*pgxpool.Tx)(nil) // a nil *pgxpool.Tx passed as a pgx.Tx
		nilLk     *Lock
	)
	fn := func(context.Context, *Lock) error { t.Error("fn ran on bad input"); return nil }
	lockCall := func(f func(context.Context, string) (*Lock, error), ctx context.Context, name string) func() error {
		return func() error {
			lk, err := f(ctx, name)
			if lk != nil {
				t.Error("a Lock was returned for bad input")
				_ = lk.Unlock(ctx)
			}
			return err
		}
	}
	allCall := func(f func(context.Context, ...string) (*Lock, error), ctx context.Context, names ...string) func() error {
		return lockCall(func(ctx context.Context, _ string) (*Lock, error) { return f(ctx, names...) }, ctx, "")
	}
	long := strings.Repeat("n", MaxNameLen+1)
	cases := []struct {
		desc string
		call func() error
		want string
	}{
		{"Lock empty name", lockCall(l.Lock, ctx, ""), "pglock: invalid name: must be 1..200 bytes, got 0"},
		{"TryLock long name", lockCall(l.TryLock, ctx, long), "pglock: invalid name: must be 1..200 bytes, got 201"},
		{"RLock NUL", lockCall(l.RLock, ctx, "a\x00b"), "pglock: invalid name: must not contain NUL (byte 1)"},
		{"TryRLock bad UTF-8", lockCall(l.TryRLock, ctx, "a\xffb"), "pglock: invalid name: must be valid UTF-8 (bad byte at 1)"},
		{"Lock nil context", lockCall(l.Lock, nilCtx, "ok"), "pglock: invalid context: is nil"},
		{"TryLock nil context", lockCall(l.TryLock, nilCtx, "ok"), "pglock: invalid context: is nil"},
		{"nil Locker Lock", lockCall(nilLocker.Lock, ctx, "ok"), "pglock: invalid locker: is nil"},
		{"nil Locker TryRLock", lockCall(nilLocker.TryRLock, ctx, "ok"), "pglock: invalid locker: is nil"},
		{"LockAll no names", allCall(l.LockAll, ctx), "pglock: invalid names: none given"},
		{"TryLockAll empty name", allCall(l.TryLockAll, ctx, "ok", ""), "pglock: invalid names[1]: must be 1..200 bytes, got 0"},
		{"LockAll NUL", allCall(l.LockAll, ctx, "a\x00b", "ok"), "pglock: invalid names[0]: must not contain NUL (byte 1)"},
		{"LockAll nil context", allCall(l.LockAll, nilCtx, "ok"), "pglock: invalid context: is nil"},
		{"nil Locker LockAll", allCall(nilLocker.LockAll, ctx, "ok"), "pglock: invalid locker: is nil"},
		{"nil Locker TryLockAll", allCall(nilLocker.TryLockAll, ctx, "ok"), "pglock: invalid locker: is nil"},
		{"Do nil fn", func() error { return l.Do(ctx, "ok", nil) }, "pglock: invalid callback: fn is nil"},
		{"Do bad name", func() error { return l.Do(ctx, "", fn) }, "pglock: invalid name: must be 1..200 bytes, got 0"},
		{"Do nil context", func() error { return l.Do(nilCtx, "ok", fn) }, "pglock: invalid context: is nil"},
		{"nil Locker Do", func() error { return nilLocker.Do(ctx, "ok", fn) }, "pglock: invalid locker: is nil"},
		{"List nil context", func() error { _, err := l.List(nilCtx); return err }, "pglock: invalid context: is nil"},
		{"nil Locker List", func() error { _, err := nilLocker.List(ctx); return err }, "pglock: invalid locker: is nil"},
		{"Get bad name", func() error { _, err := l.Get(ctx, long); return err }, "pglock: invalid name: must be 1..200 bytes, got 201"},
		{"XactLock empty name", func() error { return XactLock(ctx, tx, "") }, "pglock: invalid name: must be 1..200 bytes, got 0"},
		{"XactLock nil tx", func() error { return XactLock(ctx, nilTx, "ok") }, "pglock: invalid transaction: is nil"},
		{"XactLock nil context", func() error { return XactLock(nilCtx, tx, "ok") }, "pglock: invalid context: is nil"},
		{"TryXactLock nil tx", func() error { _, err := TryXactLock(ctx, nilTx, "ok"); return err }, "pglock: invalid transaction: is nil"},
		{"TryXactLock nil context", func() error { _, err := TryXactLock(nilCtx, tx, "ok"); return err }, "pglock: invalid context: is nil"},
		{"XactLockAll no names", func() error { return XactLockAll(ctx, tx) }, "pglock: invalid names: none given"},
		{"XactLockAll nil tx", func() error { return XactLockAll(ctx, nilTx, "ok") }, "pglock: invalid transaction: is nil"},
		{"XactLockAll nil context", func() error { return XactLockAll(nilCtx, tx, "ok") }, "pglock: invalid context: is nil"},
		{"TryXactLockAll bad UTF-8", func() error { _, err := TryXactLockAll(ctx, tx, "ok", "a\xffb"); return err },
			"pglock: invalid names[1]: must be valid UTF-8 (bad byte at 1)"},
		{"TryXactLockAll nil tx", func() error { _, err := TryXactLockAll(ctx, nilTx, "ok"); return err }, "pglock: invalid transaction: is nil"},
		{"XactLock typed nil tx", func() error { return XactLock(ctx, typedNil, "ok") }, "pglock: invalid transaction: is nil"},
		{"TryXactLock typed nil tx", func() error { _, err := TryXactLock(ctx, typedNil, "ok"); return err }, "pglock: invalid transaction: is nil"},
		{"XactLockAll typed nil tx", func() error { return XactLockAll(ctx, typedNil, "ok", "ok2") }, "pglock: invalid transaction: is nil"},
		{"TryXactLockAll nil context", func() error { _, err := TryXactLockAll(nilCtx, tx, "ok"); return err }, "pglock: invalid context: is nil"},
		{"nil Lock Unlock", func() error { return nilLk.Unlock(ctx) }, "pglock: invalid lock: is nil"},
		{"nil Lock Err", func() error { return nilLk.Err() }, "pglock: invalid lock: is nil"},
		{"New nil pool", func() error { _, err := New(nil); return err }, "pglock: invalid pool: is nil"},
		{"New nil option", func() error { _, err := New(pool, nil); return err }, "pglock: invalid option: option 0 is nil"},
		{"WithLivenessCheck interval", func() error { _, err := New(pool, WithLivenessCheck(0, time.Second)); return err },
			"pglock: invalid option WithLivenessCheck: interval must be between 10ms and 1h0m0s, got 0s"},
		{"WithLivenessCheck timeout", func() error { _, err := New(pool, WithLivenessCheck(time.Second, time.Millisecond)); return err },
			"pglock: invalid option WithLivenessCheck: timeout must be between 10ms and 1h0m0s, got 1ms"},
		{"WithUnlockTimeout", func() error { _, err := New(pool, WithUnlockTimeout(0)); return err },
			"pglock: invalid option WithUnlockTimeout: timeout must be between 10ms and 1h0m0s, got 0s"},
		{"WithLogger nil", func() error { _, err := New(pool, WithLogger(nil)); return err }, "pglock: invalid option WithLogger: logger is nil"},
		{"WithMeterProvider nil", func() error { _, err := New(pool, WithMeterProvider(nil)); return err },
			"pglock: invalid option WithMeterProvider: provider is nil"},
		{"WithMeterProvider typed nil", func() error { _, err := New(pool, WithMeterProvider((*sdkmetric.MeterProvider)(nil))); return err },
			"pglock: invalid option WithMeterProvider: provider is nil"},
	}
	for _, c := range cases {
		err := c.call()
		if !errors.Is(err, ErrInvalid) || err.Error() != c.want {
			t.Errorf("%s = %v; want ErrInvalid: %q", c.desc, err, c.want)
		}
	}
	// A nil Lock holds nothing and says so without panicking.
	select {
	case <-nilLk.Done():
	default:
		t.Error("nil Lock's Done is not closed")
	}
	if nilLk.Name() != "" || nilLk.Names() != nil || nilLk.Key() != 0 || nilLk.Shared() || nilLk.Context().Err() == nil {
		t.Error("nil Lock reports something held")
	}
	if lk, err := l.Lock(ctx, strings.Repeat("n", MaxNameLen)); err != nil {
		t.Errorf("Lock with a %d-byte name: %v", MaxNameLen, err)
	} else if err := lk.Unlock(ctx); err != nil {
		t.Error(err)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks after bad input = %d, want 0", n)
	}
}

// An ended context is not bad input: it is reported as itself, wrapped
// once, before anything is taken.
func TestEndedContextTakesNothing(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for op, f := range map[string]func(context.Context, string) (*Lock, error){
		"lock": l.Lock, "try lock": l.TryLock, "rlock": l.RLock, "try rlock": l.TryRLock,
		"lock all":     func(ctx context.Context, name string) (*Lock, error) { return l.LockAll(ctx, name) },
		"try lock all": func(ctx context.Context, name string) (*Lock, error) { return l.TryLockAll(ctx, name) },
	} {
		lk, err := f(cancelled, "ok")
		if lk != nil || !errors.Is(err, context.Canceled) || err.Error() != `pglock: `+op+` "ok": context canceled` {
			t.Errorf("%s with a cancelled context = %v, %v; want nil, context.Canceled", op, lk, err)
		}
	}
	called := false
	if err := l.Do(cancelled, "ok", func(context.Context, *Lock) error { called = true; return nil }); called || !errors.Is(err, context.Canceled) {
		t.Errorf("Do with a cancelled context = %v (fn called: %v)", err, called)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := TryXactLock(cancelled, tx, "ok"); !errors.Is(err, context.Canceled) {
		t.Errorf("TryXactLock with a cancelled context = %v, want context.Canceled", err)
	}
	if err := XactLockAll(cancelled, tx, "ok", "b"); !errors.Is(err, context.Canceled) {
		t.Errorf("XactLockAll with a cancelled context = %v, want context.Canceled", err)
	}
	if _, err := TryXactLockAll(cancelled, tx, "ok", "b"); !errors.Is(err, context.Canceled) {
		t.Errorf("TryXactLockAll with a cancelled context = %v, want context.Canceled", err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	assertIdle(t, pool)
}
