// Package metrictest reads back what pgfence's packages record through the
// OpenTelemetry metric API, with the SDK's ManualReader. It is imported by
// tests only, so the SDK never becomes a dependency of the library code.
package metrictest

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Reader is an SDK MeterProvider with a ManualReader: what a Locker or
// Client records on MP can be read back synchronously with Collect.
type Reader struct {
	MP     *sdkmetric.MeterProvider
	reader *sdkmetric.ManualReader
}

// New returns a Reader whose provider is shut down when t ends.
func New(t testing.TB) *Reader {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Reader{MP: mp, reader: reader}
}

// Point is one data point of a histogram or a counter, flattened.
type Point struct {
	Attrs string  // "k=v,k=v", sorted by key
	Count uint64  // histogram: number of measurements
	Sum   float64 // histogram: sum; counter: value
	Max   float64 // histogram
}

// Collect returns every data point recorded so far, by instrument name.
func (r *Reader) Collect(t testing.TB) map[string][]Point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect metrics: %v", err)
	}
	out := map[string][]Point{}
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					mx, _ := dp.Max.Value()
					out[mt.Name] = append(out[mt.Name], Point{Attrs: attrString(dp.Attributes.ToSlice()), Count: dp.Count, Sum: dp.Sum, Max: mx})
				}
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					out[mt.Name] = append(out[mt.Name], Point{Attrs: attrString(dp.Attributes.ToSlice()), Sum: float64(dp.Value)})
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", mt.Name, mt.Data)
			}
		}
	}
	return out
}

// attrString formats attributes (sorted by key, as attribute.Set keeps
// them) as "k=v,k=v".
func attrString(kvs []attribute.KeyValue) string {
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = string(kv.Key) + "=" + kv.Value.String()
	}
	return strings.Join(parts, ",")
}

// Find returns the point of name whose attributes are exactly attrs
// ("k=v,k=v" sorted by key), or fails t.
func Find(t testing.TB, got map[string][]Point, name, attrs string) Point {
	t.Helper()
	for _, p := range got[name] {
		if p.Attrs == attrs {
			return p
		}
	}
	t.Fatalf("%s{%s}: no data point; have %v", name, attrs, got[name])
	return Point{}
}

// Total sums the counts (histograms) or values (counters) of name.
func Total(got map[string][]Point, name string) float64 {
	var n float64
	for _, p := range got[name] {
		if p.Count > 0 {
			n += float64(p.Count)
		} else {
			n += p.Sum
		}
	}
	return n
}
