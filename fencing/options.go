package fencing

import (
	"fmt"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/spans"
)

// An Option configures InTx's telemetry: where it counts rejections and
// starts its span. The options have the names, defaults and meaning of
// pglock's and leases' options of the same name; since the package has no
// client object to hold them, InTx takes them on each call. Build each
// Option once, where the application sets up its pool, and pass it to
// every call: building it creates the instrument or tracer on its
// provider, so that InTx looks nothing up. The zero Option changes
// nothing; an invalid one makes InTx return an error matching ErrInvalid,
// having sent nothing.
type Option struct {
	rejected *rejectedCounter // nil: as is
	tracer   *spans.Tracer    // nil: as is
	err      error
}

// WithMeterProvider sets the OpenTelemetry MeterProvider InTx counts its
// rejections on (the counter pgfence.fenced_writes.rejected, created once
// here; see the package documentation's Metrics section). Default: the
// global provider, otel.GetMeterProvider(), read once at the first
// rejection counted, which records nothing until the application installs
// one with otel.SetMeterProvider (an instrument created before that is
// forwarded to it). A nil mp is invalid.
func WithMeterProvider(mp metric.MeterProvider) Option {
	if dbx.IsNil(mp) { // a typed nil too: it would panic when called
		return Option{err: fmt.Errorf("%w: option WithMeterProvider: provider is nil", ErrInvalid)}
	}
	return Option{rejected: newRejected(mp)}
}

// WithTracerProvider sets the OpenTelemetry TracerProvider InTx starts its
// span pgfence.fenced_tx on (the tracer is created once, here). Default:
// the global provider, otel.GetTracerProvider(); until the application
// installs one with otel.SetTracerProvider, InTx starts no span and
// allocates nothing for it. A nil tp is invalid.
func WithTracerProvider(tp trace.TracerProvider) Option {
	if dbx.IsNil(tp) { // a typed nil too: it would panic when called
		return Option{err: fmt.Errorf("%w: option WithTracerProvider: provider is nil", ErrInvalid)}
	}
	return Option{tracer: spans.New(tp, tracerName)}
}
