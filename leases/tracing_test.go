package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgfence/pgfence/internal/spans"
)

// With a tracer provider, acquire, renew, release, force-release and
// hand-over each end a span carrying the lease name and the fence.
func TestTracingSpans(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c, _ := setup(t, WithTracerProvider(tp))
	ctx := testContext(t)
	l, err := c.Acquire(ctx, "traced", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.ForceRelease(ctx, "traced"); !errors.Is(err, ErrNotHeld) {
		t.Fatal(err)
	}
	if _, err := c.RequestHandover(ctx, "traced", time.Second); !errors.Is(err, ErrNotHeld) {
		t.Fatal(err)
	}
	want := []string{spanAcquire, spanRenew, spanRelease, spanForceRelease, spanHandover}
	ended := rec.Ended()
	if len(ended) != len(want) {
		t.Fatalf("%d spans, want %d", len(ended), len(want))
	}
	for i, s := range ended {
		attrs := map[string]string{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.String()
		}
		if s.Name() != want[i] || attrs[spans.AttrName] != "traced" {
			t.Errorf("span %d: %s %v, want %s with the name", i, s.Name(), attrs, want[i])
		}
		if i < 3 && attrs[spans.AttrFence] != itoa(l.Fence()) {
			t.Errorf("span %s: fence %q, want %d", s.Name(), attrs[spans.AttrFence], l.Fence())
		}
	}
	if !c.tr.Enabled() {
		t.Error("tracer with a provider reports disabled")
	}
}

// Without a provider (the global one, unset) a Client starts no spans:
// BenchmarkSpanNoProvider in internal/spans measures the cost (0 allocs).
func TestTracingOffByDefault(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	if c.tr.Enabled() {
		t.Error("tracer without a provider reports enabled")
	}
}
