package fencing

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// fencing has no client object to configure, so its one instrument lives
// on the global MeterProvider (otel.GetMeterProvider()), looked up at the
// moment of a rejection: rejections are rare, the lookup costs nothing on
// the success path, and an application that installs its provider after
// start-up is still counted. Providers return the same instrument for the
// same name, so repeated lookups create nothing new.

// meterName is the instrumentation scope of the package's instrument.
const meterName = "github.com/pgfence/pgfence/fencing"

// metricRejected counts writes the guard rejected within InTx.
const metricRejected = "pgfence.fenced_writes.rejected"

// Values of the "reason" attribute.
const (
	reasonStale   = "stale"    // PF001: ErrStale
	reasonNoToken = "no_token" // PF002: ErrNoToken
)

// recordRejected counts err if classify made it a guard rejection. A
// provider that refuses the instrument makes it count nothing.
func recordRejected(ctx context.Context, err error) {
	var reason string
	switch {
	case errors.Is(err, ErrStale):
		reason = reasonStale
	case errors.Is(err, ErrNoToken):
		reason = reasonNoToken
	default:
		return
	}
	c, cerr := otel.GetMeterProvider().Meter(meterName).Int64Counter(metricRejected,
		metric.WithUnit("{write}"),
		metric.WithDescription("Transactions of fencing.InTx whose writes the fence guard rejected (stale token, or no token)."))
	if cerr != nil || c == nil {
		return
	}
	c.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("reason", reason)))
}
