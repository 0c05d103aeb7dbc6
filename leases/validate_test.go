package leases

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func TestMarginAndDeadlineArithmetic(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ ttl, want time.Duration }{
		{time.Second, 100 * time.Millisecond},
		{30 * time.Second, 3 * time.Second},
	} {
		if got := margin(tc.ttl); got != tc.want {
			t.Errorf("margin(%s) = %s, want %s", tc.ttl, got, tc.want)
		}
		// The keepalive renews at TTL/3 and retries until TTL − margin:
		// there must be room for at least one retry.
		if tc.ttl/3 >= tc.ttl-margin(tc.ttl) {
			t.Errorf("ttl %s: renewal at %s is not before the deadline", tc.ttl, tc.ttl/3)
		}
	}
	for range 1000 {
		if d := jitter(time.Second); d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("jitter(1s) = %s, want within [500ms, 1s]", d)
		}
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := New(nil); err == nil || !strings.Contains(err.Error(), "pool must not be nil") {
		t.Errorf("New(nil) = %v, want pool error", err)
	}
	_, pool := setup(t)
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithOwner(""), "owner id must be 1..100 bytes, got 0"},
		{WithOwner(strings.Repeat("o", MaxOwnerLen+1)), "owner id must be 1..100 bytes, got 101"},
		{WithOwner("a\x00b"), "owner id must not contain NUL"},
		{WithOwner("\xff"), "owner id must be valid UTF-8"},
		{WithLogger(nil), "logger must not be nil"},
		{WithPollInterval(time.Millisecond), "poll interval must be between 10ms and 1h0m0s, got 1ms"},
		{WithPollInterval(2 * time.Hour), "poll interval must be between"},
		{WithReleaseTimeout(time.Millisecond), "invalid option WithReleaseTimeout: timeout must be between 10ms and 1h0m0s, got 1ms"},
		{nil, "option must not be nil"},
		// A typed nil is nil too: New would call it and panic.
		{WithMeterProvider((*sdkmetric.MeterProvider)(nil)), "meter provider must not be nil"},
		{WithTracerProvider((*sdktrace.TracerProvider)(nil)), "tracer provider must not be nil"},
	} {
		c, err := New(pool, tc.opt)
		if err == nil {
			c.Close()
			t.Errorf("New with bad option: no error, want %q", tc.want)
			continue
		}
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "leases: ") {
			t.Errorf("New: %v, want ErrInvalid saying %q", err, tc.want)
		}
	}
	if c, err := New(pool, WithOwner("billing-7"), WithLogger(slog.Default()), WithPollInterval(time.Second), WithNotifications(false)); err != nil {
		t.Errorf("New with good options: %v", err)
	} else {
		c.Close()
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	noop := func(context.Context, *Lease) error { return nil }
	for _, tc := range []struct {
		name string
		ttl  time.Duration
		want string
	}{
		{"", time.Minute, "lease name must be 1..200 bytes, got 0"},
		{strings.Repeat("n", MaxNameLen+1), time.Minute, "lease name must be 1..200 bytes, got 201"},
		{"a\x00b", time.Minute, "lease name must not contain NUL"},
		{"\xff\xfe", time.Minute, "lease name must be valid UTF-8"},
		{"ok", 200 * time.Millisecond, "ttl must be at least 1s, got 200ms"},
		{"ok", 0, "ttl must be at least 1s, got 0s"},
		{"ok", -time.Second, "ttl must be at least 1s, got -1s"},
	} {
		calls := map[string]error{}
		_, calls["TryAcquire"] = c.TryAcquire(ctx, tc.name, tc.ttl)
		_, calls["Acquire"] = c.Acquire(ctx, tc.name, tc.ttl)
		calls["Run"] = c.Run(ctx, tc.name, tc.ttl, noop)
		calls["Lead"] = c.Lead(ctx, tc.name, tc.ttl, noop)
		for call, err := range calls {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s(%q, %s) = %v, want %q", call, tc.name, tc.ttl, err, tc.want)
			}
		}
		if tc.name != "ok" {
			if _, err := c.Get(ctx, tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Get(%q) = %v, want %q", tc.name, err, tc.want)
			}
			if err := c.ForceRelease(ctx, tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ForceRelease(%q) = %v, want %q", tc.name, err, tc.want)
			}
			if _, err := c.Observe(ctx, tc.name); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Observe(%q) = %v, want %q", tc.name, err, tc.want)
			}
		}
	}
	// A cancelled context is bad input too.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.TryAcquire(cancelled, "ok", time.Minute); !errors.Is(err, context.Canceled) {
		t.Errorf("TryAcquire(cancelled ctx) = %v, want context.Canceled", err)
	}
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pgfence.leases").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("bad input wrote to the database: %d lease rows", rows)
	}
}

func TestMissingSchemaHint(t *testing.T) {
	t.Parallel()
	pool := pgtestPoolEmpty(t)
	c := newClient(t, pool)
	ctx := testContext(t)
	_, err := c.TryAcquire(ctx, "x", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "schema pgfence missing or out of date: run `pgfence migrate up`") {
		t.Fatalf("TryAcquire without schema = %v, want the migrate hint", err)
	}
	if !permanent(err) {
		t.Errorf("missing schema is not treated as permanent: %v", err)
	}
	if _, err := c.List(ctx); err == nil || !strings.Contains(err.Error(), "pgfence migrate up") {
		t.Errorf("List without schema = %v, want the migrate hint", err)
	}
	// Lead stops at once rather than campaigning forever.
	if err := c.Lead(ctx, "x", time.Minute, func(context.Context, *Lease) error { return nil }); err == nil || !strings.Contains(err.Error(), "pgfence migrate up") {
		t.Errorf("Lead without schema = %v, want the migrate hint", err)
	}
}

// An out-of-date schema (here: one whose grant function a later migration
// would add) fails with the same hint, and says it may be out of date
// rather than absent: the operator has a schema pgfence.
func TestOutOfDateSchemaHint(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	const drop = `DO $$ DECLARE f regprocedure; BEGIN
	  FOR f IN SELECT oid FROM pg_proc WHERE pronamespace = 'pgfence'::regnamespace AND proname = 'try_acquire' LOOP
	    EXECUTE 'DROP FUNCTION ' || f;
	  END LOOP; END $$`
	if _, err := pool.Exec(ctx, drop); err != nil {
		t.Fatal(err)
	}
	_, err := c.TryAcquire(ctx, "x", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "schema pgfence missing or out of date: run `pgfence migrate up`") {
		t.Fatalf("TryAcquire on an out-of-date schema = %v, want the migrate hint", err)
	}
	if !permanent(err) {
		t.Errorf("out-of-date schema is not treated as permanent: %v", err)
	}
}
