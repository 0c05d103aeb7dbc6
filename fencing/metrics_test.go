package fencing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/spans"
)

// rejected returns pgfence.fenced_writes.rejected by its reason attribute.
func rejected(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect metrics: %v", err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "pgfence.fenced_writes.rejected" {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic {
				t.Fatalf("%s: data %T, want a monotonic int64 sum", m.Name, m.Data)
			}
			if m.Unit != "{write}" {
				t.Errorf("%s: unit %q, want {write}", m.Name, m.Unit)
			}
			if sm.Scope.Name != "github.com/pgfence/pgfence/fencing" {
				t.Errorf("%s: scope %q", m.Name, sm.Scope.Name)
			}
			for _, dp := range sum.DataPoints {
				reason, _ := dp.Attributes.Value("reason")
				out[reason.AsString()] += dp.Value
			}
		}
	}
	return out
}

// InTx counts each rejection on the provider of WithMeterProvider, by
// reason; successful writes, calls without the option, and rejections of
// statements run on Begin's transaction (plain SQL) are not counted there.
func TestMetricsRejectedWrites(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	fenced := fencing.WithMeterProvider(mp)

	pool := setup(t)
	old := grant(t, pool, "metrics", time.Minute)
	if err := write(pool, old, 1, "a", fenced); err != nil {
		t.Fatal(err)
	}
	expire(t, pool, "metrics")
	cur := grant(t, pool, "metrics", time.Minute)
	if err := write(pool, cur, 1, "b", fenced); err != nil {
		t.Fatal(err)
	}
	if got := rejected(t, reader); len(got) != 0 {
		t.Fatalf("rejected after successful writes = %v, want nothing", got)
	}

	for range 2 {
		wantStaleTx(t, write(pool, old, 1, "stale", fenced), old)
	}
	// Counted on the global provider, not on mp: a call without the option.
	wantStaleTx(t, write(pool, old, 1, "stale"), old)
	// A rejection InTx cannot see: a statement on Begin's transaction.
	tx, err := fencing.Begin(bg, pool, old)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(bg, upsertItem, 1, "plain")
	_ = tx.Rollback(bg)
	wantStale(t, err)
	// No token: fn clears the declaration before writing.
	err = fencing.InTx(bg, pool, cur, func(tx pgx.Tx) error {
		if _, err := tx.Exec(bg, `SELECT set_config('pgfence.token', '', true)`); err != nil {
			return err
		}
		_, err := tx.Exec(bg, upsertItem, 1, "no token")
		return err
	}, fenced)
	if !errors.Is(err, fencing.ErrNoToken) {
		t.Fatalf("InTx writing without a token = %v, want ErrNoToken", err)
	}

	got := rejected(t, reader)
	if got["stale"] != 2 || got["no_token"] != 1 || len(got) != 2 {
		t.Errorf("rejected = %v, want map[no_token:1 stale:2]", got)
	}
	wantItem(t, pool, 1, "b", cur.Fence)
}

// WithTracerProvider puts InTx's span on that provider, with the token as
// attributes and the rejection as its error.
func TestTracerProvider(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	traced := fencing.WithTracerProvider(tp)

	pool := setup(t)
	old := grant(t, pool, "traced", time.Minute)
	expire(t, pool, "traced")
	cur := grant(t, pool, "traced", time.Minute)
	if err := write(pool, cur, 1, "b", traced); err != nil {
		t.Fatal(err)
	}
	wantStaleTx(t, write(pool, old, 1, "stale", traced), old)
	if err := write(pool, cur, 1, "c"); err != nil { // no option: not on tp
		t.Fatal(err)
	}
	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans, want 2", len(ended))
	}
	for i, tok := range []fencing.Token{cur, old} {
		s := ended[i]
		attrs := map[string]any{}
		for _, a := range s.Attributes() {
			attrs[string(a.Key)] = a.Value.AsInterface()
		}
		if s.Name() != "pgfence.fenced_tx" || attrs[spans.AttrName] != tok.Lease || attrs[spans.AttrFence] != tok.Fence {
			t.Errorf("span %d: %s %v, want pgfence.fenced_tx for %v", i, s.Name(), attrs, tok)
		}
		if failed := s.Status().Description != ""; failed != (i == 1) {
			t.Errorf("span %d: status %+v, want an error only for the stale write", i, s.Status())
		}
	}
}

// A nil provider is invalid: InTx returns ErrInvalid naming the option and
// sends nothing (fn does not run). The zero Option changes nothing.
func TestNilProviderInvalid(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "nil", time.Minute)
	for name, opt := range map[string]fencing.Option{
		"WithMeterProvider":  fencing.WithMeterProvider(nil),
		"WithTracerProvider": fencing.WithTracerProvider(nil),
	} {
		checkNilProvider(t, pool, tok, name, opt)
	}
	// A typed nil is nil too: building the option would call it and panic.
	for name, opt := range map[string]func() fencing.Option{
		"WithMeterProvider":  func() fencing.Option { return fencing.WithMeterProvider((*sdkmetric.MeterProvider)(nil)) },
		"WithTracerProvider": func() fencing.Option { return fencing.WithTracerProvider((*sdktrace.TracerProvider)(nil)) },
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s(typed nil) panicked: %v", name, r)
				}
			}()
			checkNilProvider(t, pool, tok, name, opt())
		}()
	}
	if err := fencing.InTx(bg, pool, tok, func(pgx.Tx) error { return nil }, fencing.Option{}); err != nil {
		t.Errorf("InTx with the zero Option: %v", err)
	}
}

// checkNilProvider checks that InTx with opt, built from a nil provider,
// returns ErrInvalid naming the option, without running fn.
func checkNilProvider(t *testing.T, pool fencing.DB, tok fencing.Token, name string, opt fencing.Option) {
	t.Helper()
	ran := false
	err := fencing.InTx(bg, pool, tok, func(pgx.Tx) error { ran = true; return nil }, opt)
	if !errors.Is(err, fencing.ErrInvalid) || !strings.Contains(err.Error(), name) || ran {
		t.Errorf("%s(nil): %v, fn ran %v; want ErrInvalid naming the option, fn not run", name, err, ran)
	}
}

// A nil context is invalid also when a tracer provider records spans:
// the check comes before the span (which would read the context).
func TestNilContextWithTracer(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	pool := setup(t)
	tok := grant(t, pool, "nilctx", time.Minute)
	var nilCtx context.Context
	ran := false
	err := fencing.InTx(nilCtx, pool, tok, func(pgx.Tx) error { ran = true; return nil }, fencing.WithTracerProvider(tp))
	if !errors.Is(err, fencing.ErrInvalid) || ran {
		t.Errorf("InTx(nil ctx) with a tracer: %v, fn ran %v; want ErrInvalid, fn not run", err, ran)
	}
}
