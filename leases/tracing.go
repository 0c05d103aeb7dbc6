package leases

import (
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/spans"
)

// Tracing: a Client starts spans through the OpenTelemetry trace API on
// the provider of WithTracerProvider (default: the global one). Nothing is
// recorded, and nothing allocated, until a provider is configured.

// tracerName is the instrumentation scope of the Client's spans.
const tracerName = "github.com/pgfence/pgfence/leases"

// Span names. Attributes: pgfence.lease.name and, once known,
// pgfence.lease.fence.
const (
	spanAcquire      = "pgfence.lease.acquire"       // Acquire (the wait included), TryAcquire
	spanRenew        = "pgfence.lease.renew"         // Renew, Extend, a keepalive batch (name and fence when it renews one lease)
	spanRelease      = "pgfence.lease.release"       // Release, Close's batch
	spanForceRelease = "pgfence.lease.force_release" // ForceRelease
	spanHandover     = "pgfence.lease.handover"      // RequestHandover, the wait included
)

// WithTracerProvider sets the OpenTelemetry TracerProvider the client
// starts its spans on: acquire (the wait included), renew (Renew, Extend
// and each keepalive batch), release, force-release and hand-over, with
// the lease name and fence as attributes. Default: the global provider,
// otel.GetTracerProvider(); until the application installs one with
// otel.SetTracerProvider the client starts no spans at all (no
// allocations). Must not be nil.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) error {
		if dbx.IsNil(tp) { // a typed nil too: it would panic when called
			return invalid("leases: tracer provider must not be nil")
		}
		c.tracer = tp
		return nil
	}
}

func newTracer(cfg config) *spans.Tracer { return spans.New(cfg.tracer, tracerName) }
