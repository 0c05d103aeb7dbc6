package spans

import (
	"context"
	"errors"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"
)

// The global provider is recognised as unset, so the default Tracer starts
// nothing and allocates nothing; so does one on the no-op provider.
func TestNoProviderNoAllocations(t *testing.T) {
	if unset == nil {
		t.Fatal("the global tracer provider's stand-in was not recognised")
	}
	ctx := context.Background()
	for _, tr := range []*Tracer{New(nil, "test"), New(noop.NewTracerProvider(), "test")} {
		allocs := testing.AllocsPerRun(1000, func() {
			c, s := tr.Start(ctx, "op", "name", 42)
			s.End(43, nil)
			if c != ctx {
				t.Fatal("context changed without a provider")
			}
		})
		if allocs != 0 {
			t.Errorf("%v allocations per span without a provider, want 0", allocs)
		}
	}
}

// An explicit provider records the span with name, fence and error.
func TestExplicitProviderRecords(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	_, s := New(tp, "test").Start(context.Background(), "pgfence.op", "job", 0)
	s.End(7, errors.New("boom"))
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Name() != "pgfence.op" {
		t.Fatalf("recorded %v, want one span pgfence.op", ended)
	}
	got := map[string]string{}
	for _, a := range ended[0].Attributes() {
		got[string(a.Key)] = a.Value.String()
	}
	if got[AttrName] != "job" || got[AttrFence] != "7" || ended[0].Status().Description != "boom" {
		t.Errorf("attributes %v, status %v; want name job, fence 7, error boom", got, ended[0].Status())
	}
}

// BenchmarkSpanNoProvider is the cost of a span while no provider is set.
func BenchmarkSpanNoProvider(b *testing.B) {
	tr := New(nil, "bench")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, s := tr.Start(ctx, "op", "name", 42)
		s.End(43, nil)
	}
}
