// Package spans starts the OpenTelemetry spans of leases and fencing the
// same way: through the trace API only, with the lease name and fence as
// attributes, and at no cost — no allocation, a few nanoseconds — while no
// tracer provider is configured.
//
// The trace API's own no-op path allocates (a context and a span value per
// Start), so a Tracer decides first whether anything would record: a
// provider given explicitly is used unless it is the API's no-op provider;
// the default, the global provider, is used only once the application has
// installed one with otel.SetTracerProvider (the Tracer created on the
// global provider beforehand then delegates to it).
package spans

import (
	"context"
	"reflect"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Attribute keys.
const (
	AttrName  = "pgfence.lease.name"
	AttrFence = "pgfence.lease.fence"
)

// unset is the global provider as it is before the application installs
// one (the API's delegating stand-in), or nil if one was installed before
// this package was initialised.
var unset = func() trace.TracerProvider {
	tp := otel.GetTracerProvider()
	if reflect.TypeOf(tp).String() == "*global.tracerProvider" {
		return tp
	}
	return nil
}()

// Tracer starts spans for one instrumentation scope.
type Tracer struct {
	tracer trace.Tracer // nil: never records
	global bool         // tracer is the global provider's: check it is set
}

// New returns a Tracer on tp, or on the global provider if tp is nil.
func New(tp trace.TracerProvider, scope string) *Tracer {
	if tp == nil {
		return &Tracer{tracer: otel.GetTracerProvider().Tracer(scope), global: true}
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return &Tracer{}
	}
	return &Tracer{tracer: tp.Tracer(scope)}
}

// Span is a started span, or nothing. Its zero value is valid and ends
// nothing.
type Span struct {
	s trace.Span
}

// Start starts a span named op, with the lease name (if not empty) and
// the fence (if positive) as attributes, under ctx; it returns ctx
// carrying the span. While nothing would record it returns ctx itself and
// a zero Span, allocating nothing.
func (t *Tracer) Start(ctx context.Context, op, name string, fence int64) (context.Context, Span) {
	if !t.Enabled() {
		return ctx, Span{}
	}
	attrs := make([]attribute.KeyValue, 0, 2)
	if name != "" {
		attrs = append(attrs, attribute.String(AttrName, name))
	}
	if fence > 0 {
		attrs = append(attrs, attribute.Int64(AttrFence, fence))
	}
	ctx, s := t.tracer.Start(ctx, op, trace.WithAttributes(attrs...))
	return ctx, Span{s}
}

// End ends the span, adding the fence if it was not known at Start (a
// grant's) and recording err, if any, as the span's error status.
func (s Span) End(fence int64, err error) {
	if s.s == nil {
		return
	}
	if fence > 0 {
		s.s.SetAttributes(attribute.Int64(AttrFence, fence))
	}
	if err != nil {
		s.s.RecordError(err)
		s.s.SetStatus(codes.Error, err.Error())
	}
	s.s.End()
}

// Enabled reports whether Start would start a span now.
func (t *Tracer) Enabled() bool {
	return t.tracer != nil && !(t.global && otel.GetTracerProvider() == unset)
}
