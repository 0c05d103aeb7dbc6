package leases

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgfence/pgfence/internal/instruments"
)

// Metrics are recorded through the OpenTelemetry metric API only; the
// application chooses the SDK and exporter (see WithMeterProvider and the
// package documentation's Metrics section for the instruments).

// meterName is the instrumentation scope of the Client's instruments.
const meterName = "github.com/pgfence/pgfence/leases"

// Instrument names and attribute keys. Names follow OpenTelemetry's
// semantic-convention style; units are UCUM.
const (
	metricAcquire  = "pgfence.lease.acquire.duration"
	metricHold     = "pgfence.lease.hold.duration"
	metricRenewals = "pgfence.lease.renewals"
	metricLost     = "pgfence.lease.lost"

	attrTry     = "try"     // acquire: true for TryAcquire
	attrOutcome = "outcome" // acquire, hold, renewals
	attrCause   = "cause"   // lost
	attrName    = "name"    // opt-in: WithNameAttribute
)

// acquireOutcome says how an Acquire or TryAcquire call ended.
type acquireOutcome uint8

const (
	acquireAcquired acquireOutcome = iota // granted
	acquireHeld                           // TryAcquire: another owner holds it
	acquireCanceled                       // ctx ended first
	acquireClosed                         // the Client was closed
	acquireError                          // database error
	numAcquireOutcomes
)

var acquireOutcomeNames = [numAcquireOutcomes]string{"acquired", "held", "canceled", "closed", "error"}

// renewOutcome says what one renewal attempt of one lease did.
type renewOutcome uint8

const (
	renewRenewed renewOutcome = iota // the database extended the grant
	renewBusy                        // the row was locked (a fenced transaction): retried shortly
	renewLost                        // the grant was gone: the lease is lost (not when its own Release ended it)
	renewError                       // the statement failed: retried until the local deadline
	numRenewOutcomes
)

var renewOutcomeNames = [numRenewOutcomes]string{"renewed", "busy", "lost", "error"}

// lostCause says how a held lease was lost. See the package documentation
// (# Metrics) for exactly what each one means.
type lostCause uint8

const (
	lostRenewRejected   lostCause = iota // a renewal matched no live row
	lostDeadline                         // no successful renewal before the local deadline
	lostForceReleased                    // a renewal matched no live row after a release notification or this client's ForceRelease
	lostReleaseRejected                  // Release found the grant already gone or expired
	numLostCauses
)

var lostCauseNames = [numLostCauses]string{"renew_rejected", "deadline", "force_released", "release_rejected"}

// metrics holds a Client's instruments and, for every combination of the
// fixed attributes, the recording options built once in New: recording
// then allocates nothing unless the name attribute is on.
type metrics struct {
	nameAttr bool
	acquire  metric.Float64Histogram
	hold     metric.Float64Histogram
	renewals metric.Int64Counter
	lost     metric.Int64Counter

	acquireOpts [2][numAcquireOutcomes][]metric.RecordOption // [try][outcome]
	holdOpts    [2][]metric.RecordOption                     // [lost]
	renewOpts   [numRenewOutcomes][]metric.AddOption
	lostOpts    [numLostCauses][]metric.AddOption
}

// newMetrics creates the instruments on mp. An instrument the provider
// refuses is replaced by a no-op one and logged: metrics never stop leases.
func newMetrics(mp metric.MeterProvider, nameAttr bool, log *slog.Logger) *metrics {
	f := instruments.New(mp, meterName)
	m := &metrics{nameAttr: nameAttr}
	m.acquire = f.Duration(metricAcquire, "Time from an Acquire or TryAcquire call to the grant or the failure, waiting included.")
	m.hold = f.Duration(metricHold, "Time a lease grant was held by this client, from the grant to Release, Close or loss.")
	m.renewals = f.Counter(metricRenewals, "{renewal}", "Renewal attempts, per lease, by the keepalive and Lease.Renew.")
	m.lost = f.Counter(metricLost, "{lease}", "Held leases that were lost, by cause.")
	if err := f.Err(); err != nil {
		log.Warn("leases: metric instruments unavailable; using no-op instruments", "err", err)
	}

	for t, try := range []bool{false, true} {
		for o := range numAcquireOutcomes {
			set := attribute.NewSet(attribute.Bool(attrTry, try), attribute.String(attrOutcome, acquireOutcomeNames[o]))
			m.acquireOpts[t][o] = []metric.RecordOption{metric.WithAttributeSet(set)}
		}
	}
	for l, outcome := range []string{"released", "lost"} {
		m.holdOpts[l] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(attrOutcome, outcome)))}
	}
	for o := range numRenewOutcomes {
		m.renewOpts[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(attrOutcome, renewOutcomeNames[o])))}
	}
	for c := range numLostCauses {
		m.lostOpts[c] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String(attrCause, lostCauseNames[c])))}
	}
	return m
}

// nameOpt is the opt-in name attribute (WithNameAttribute), appended to a
// copy of the shared options.
func nameOpt(name string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String(attrName, name))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recordAcquire records an acquire call that began at start and ended now.
func (m *metrics) recordAcquire(ctx context.Context, name string, try bool, o acquireOutcome, start time.Time) {
	opts := m.acquireOpts[b2i(try)][o]
	if m.nameAttr {
		if !m.acquire.Enabled(ctx) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], nameOpt(name))
	}
	m.acquire.Record(ctx, time.Since(start).Seconds(), opts...)
}

// recordHold records the end of l's hold at end.
func (m *metrics) recordHold(l *Lease, lost bool, end time.Time) {
	opts := m.holdOpts[b2i(lost)]
	if m.nameAttr {
		if !m.hold.Enabled(context.Background()) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], nameOpt(l.name))
	}
	m.hold.Record(context.Background(), end.Sub(l.since).Seconds(), opts...)
}

// recordRenewal counts one renewal attempt of the lease name.
func (m *metrics) recordRenewal(name string, o renewOutcome) {
	opts := m.renewOpts[o]
	if m.nameAttr {
		if !m.renewals.Enabled(context.Background()) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], nameOpt(name))
	}
	m.renewals.Add(context.Background(), 1, opts...)
}

// recordLost counts one lost lease.
func (m *metrics) recordLost(name string, cause lostCause) {
	opts := m.lostOpts[cause]
	if m.nameAttr {
		if !m.lost.Enabled(context.Background()) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], nameOpt(name))
	}
	m.lost.Add(context.Background(), 1, opts...)
}

// acquireOutcomeOf classifies the result of an acquire call.
func acquireOutcomeOf(ctx context.Context, l *Lease, err error) acquireOutcome {
	switch {
	case l != nil:
		return acquireAcquired
	case errors.Is(err, ErrHeld):
		return acquireHeld
	case errors.Is(err, ErrClosed):
		return acquireClosed
	case ctx.Err() != nil:
		return acquireCanceled
	default:
		return acquireError
	}
}
