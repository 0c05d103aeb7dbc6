package fencing

import (
	"context"
	"errors"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgfence/pgfence/internal/instruments"
)

// InTx counts the rejections it returns on one counter. The counter is
// created once per provider: by WithMeterProvider, or, without it, on the
// global provider at the first rejection. Nothing is looked up or
// allocated for it on the success path.

// meterName is the instrumentation scope of the package's instrument.
const meterName = "github.com/pgfence/pgfence/fencing"

// metricRejected counts writes the guard rejected within InTx.
const metricRejected = "pgfence.fenced_writes.rejected"

// The "reason" attribute and its values.
const (
	attrReason    = "reason"
	reasonStale   = "stale"    // PF001: ErrStale
	reasonNoToken = "no_token" // PF002: ErrNoToken
)

// rejectedCounter is the counter of rejections on one provider, with the
// recording options of both reasons built once.
type rejectedCounter struct {
	c       metric.Int64Counter
	stale   []metric.AddOption
	noToken []metric.AddOption
}

// newRejected creates the counter on mp; a provider that refuses it gets a
// counter that counts nothing.
func newRejected(mp metric.MeterProvider) *rejectedCounter {
	reason := func(r string) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(attrReason, r)))}
	}
	return &rejectedCounter{
		c: instruments.New(mp, meterName).Counter(metricRejected, "{write}",
			"Transactions of fencing.InTx whose writes the fence guard rejected (stale token, or no token)."),
		stale:   reason(reasonStale),
		noToken: reason(reasonNoToken),
	}
}

// globalRejected is the counter on the global provider, created at the
// first rejection counted without WithMeterProvider. Before the
// application installs a provider, the global one forwards to the one it
// installs later.
var globalRejected = sync.OnceValue(func() *rejectedCounter { return newRejected(otel.GetMeterProvider()) })

// record counts err if classify made it a guard rejection. A nil r is the
// global provider's counter.
func (r *rejectedCounter) record(ctx context.Context, err error) {
	stale := errors.Is(err, ErrStale)
	if !stale && !errors.Is(err, ErrNoToken) {
		return
	}
	if r == nil {
		r = globalRejected()
	}
	opts := r.noToken
	if stale {
		opts = r.stale
	}
	r.c.Add(context.WithoutCancel(ctx), 1, opts...)
}
