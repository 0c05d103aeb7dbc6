// Package instruments creates the OpenTelemetry instruments of pglock and
// leases the same way: through the metric API only, with one set of
// duration buckets, and with a no-op stand-in for any instrument the
// provider refuses, so that metrics never stop locking.
package instruments

import (
	"errors"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// DurationBuckets are the histogram boundaries, in seconds: from a
// millisecond (an uncontended grant) to a day (a long-held lock or lease).
var DurationBuckets = []float64{
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400,
}

// Factory creates instruments on one meter and collects the errors of the
// ones the provider refused.
type Factory struct {
	meter metric.Meter
	errs  []error
}

// New returns a Factory for the instrumentation scope on mp.
func New(mp metric.MeterProvider, scope string) *Factory {
	return &Factory{meter: mp.Meter(scope)}
}

// Duration returns a float64 histogram in seconds with DurationBuckets, or
// a no-op histogram if the provider refuses it.
func (f *Factory) Duration(name, desc string) metric.Float64Histogram {
	h, err := f.meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	if err != nil || h == nil {
		f.errs = append(f.errs, err)
		return noop.Float64Histogram{}
	}
	return h
}

// Counter returns an int64 counter with the given UCUM unit ("{lock}"), or
// a no-op counter if the provider refuses it.
func (f *Factory) Counter(name, unit, desc string) metric.Int64Counter {
	c, err := f.meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil || c == nil {
		f.errs = append(f.errs, err)
		return noop.Int64Counter{}
	}
	return c
}

// UpDownCounter returns an int64 up-down counter with the given UCUM unit,
// or a no-op one if the provider refuses it: a gauge kept by Add(+1) and
// Add(-1), which needs no callback and so no unregistering.
func (f *Factory) UpDownCounter(name, unit, desc string) metric.Int64UpDownCounter {
	c, err := f.meter.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	if err != nil || c == nil {
		f.errs = append(f.errs, err)
		return noop.Int64UpDownCounter{}
	}
	return c
}

// Err reports the instruments the provider refused (replaced by no-ops),
// or nil.
func (f *Factory) Err() error { return errors.Join(f.errs...) }
