package pglock

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pgfence/pgfence/internal/instruments"
)

// Metrics are recorded through the OpenTelemetry metric API only; the
// application chooses the SDK and exporter (see WithMeterProvider and the
// package documentation's Metrics section for the instruments).

// meterName is the instrumentation scope of the Locker's instruments.
const meterName = "github.com/pgfence/pgfence/pglock"

// Instrument names, units and attribute keys. Names follow OpenTelemetry's
// semantic-convention style; units are UCUM.
const (
	metricWait = "pgfence.lock.wait.duration"
	metricHold = "pgfence.lock.hold.duration"
	metricLost = "pgfence.lock.lost"
	metricHeld = "pgfence.lock.held"

	attrMode    = "mode"    // exclusive | shared
	attrTry     = "try"     // true for TryLock/TryRLock
	attrOutcome = "outcome" // wait: acquired | locked | canceled | error; hold: unlocked | lost
	attrCause   = "cause"   // lost: session_ended | liveness_failed | not_held
	attrName    = "name"    // opt-in: WithNameAttribute
)

// waitOutcome says how an acquire ended.
type waitOutcome uint8

const (
	waitAcquired waitOutcome = iota // the lock was granted
	waitLocked                      // TryLock/TryRLock: held by another session
	waitCanceled                    // ctx ended before the grant
	waitError                       // any other failure
	numWaitOutcomes
)

var waitOutcomeNames = [numWaitOutcomes]string{"acquired", "locked", "canceled", "error"}

// lostCause says how a held lock was lost.
type lostCause uint8

const (
	lostSessionEnded   lostCause = iota // the server closed or reset the session
	lostLivenessFailed                  // the liveness check failed or timed out
	lostNotHeld                         // pg_advisory_unlock answered false
	numLostCauses
)

var lostCauseNames = [numLostCauses]string{"session_ended", "liveness_failed", "not_held"}

// metrics holds a Locker's instruments and, for every combination of the
// fixed attributes, the recording options built once in New: recording
// then allocates nothing unless the name attribute is on.
type metrics struct {
	nameAttr bool
	wait     metric.Float64Histogram
	hold     metric.Float64Histogram
	lost     metric.Int64Counter
	held     metric.Int64UpDownCounter

	waitOpts [2][2][numWaitOutcomes][]metric.RecordOption // [shared][try][outcome]
	holdOpts [2][2][]metric.RecordOption                  // [shared][lost]
	heldOpts [2][]metric.AddOption                        // [shared]
	lostOpts [2][numLostCauses][]metric.AddOption         // [shared][cause]
}

func modeName(shared bool) string {
	if shared {
		return "shared"
	}
	return "exclusive"
}

// newMetrics creates the instruments on mp. An instrument the provider
// refuses is replaced by a no-op one and logged: metrics never stop locking.
func newMetrics(mp metric.MeterProvider, nameAttr bool, log *slog.Logger) *metrics {
	f := instruments.New(mp, meterName)
	m := &metrics{nameAttr: nameAttr}
	m.wait = f.Duration(metricWait, "Time from a Lock, RLock, TryLock or TryRLock call to the grant or the failure, connection acquisition included.")
	m.hold = f.Duration(metricHold, "Time a session advisory lock was held, from the grant to Unlock or loss.")
	m.lost = f.Counter(metricLost, "{lock}", "Held session advisory locks that were lost (the session died, stopped answering, or no longer held the lock at Unlock).")
	m.held = f.UpDownCounter(metricHeld, "{lock}", "Session advisory locks held now (a set taken by LockAll or TryLockAll counts once).")
	if err := f.Err(); err != nil {
		log.Warn("pglock: metric instruments unavailable; using no-op instruments", slog.Any("err", err))
	}

	for s, shared := range []bool{false, true} {
		mode := attribute.String(attrMode, modeName(shared))
		for t, try := range []bool{false, true} {
			for o := range numWaitOutcomes {
				set := attribute.NewSet(mode, attribute.Bool(attrTry, try), attribute.String(attrOutcome, waitOutcomeNames[o]))
				m.waitOpts[s][t][o] = []metric.RecordOption{metric.WithAttributeSet(set)}
			}
		}
		for l, outcome := range []string{"unlocked", "lost"} {
			set := attribute.NewSet(mode, attribute.String(attrOutcome, outcome))
			m.holdOpts[s][l] = []metric.RecordOption{metric.WithAttributeSet(set)}
		}
		m.heldOpts[s] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(mode))}
		for c := range numLostCauses {
			set := attribute.NewSet(mode, attribute.String(attrCause, lostCauseNames[c]))
			m.lostOpts[s][c] = []metric.AddOption{metric.WithAttributeSet(set)}
		}
	}
	return m
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// recordWait records an acquire that began at start and ended now.
func (m *metrics) recordWait(ctx context.Context, name string, md mode, o waitOutcome, start, now time.Time) {
	opts := m.waitOpts[b2i(md.shared)][b2i(md.try)][o]
	if m.nameAttr {
		if !m.wait.Enabled(ctx) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], metric.WithAttributes(attribute.String(attrName, name)))
	}
	m.wait.Record(ctx, now.Sub(start).Seconds(), opts...)
}

// recordHold records a hold that began at granted and ended now.
func (m *metrics) recordHold(name string, shared, lost bool, granted, now time.Time) {
	opts := m.holdOpts[b2i(shared)][b2i(lost)]
	if m.nameAttr {
		if !m.hold.Enabled(context.Background()) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], metric.WithAttributes(attribute.String(attrName, name)))
	}
	m.hold.Record(context.Background(), now.Sub(granted).Seconds(), opts...)
}

// recordHeld adds delta (+1 at a grant, -1 when the hold ends) to the
// locks held now. No name attribute: the gauge counts, and a name that
// was added would have to be subtracted with the same attributes.
func (m *metrics) recordHeld(shared bool, delta int64) {
	m.held.Add(context.Background(), delta, m.heldOpts[b2i(shared)]...)
}

// recordLost counts one lost lock.
func (m *metrics) recordLost(name string, shared bool, cause lostCause) {
	opts := m.lostOpts[b2i(shared)][cause]
	if m.nameAttr {
		if !m.lost.Enabled(context.Background()) {
			return // spare the name attribute's allocations
		}
		opts = append(opts[:len(opts):len(opts)], metric.WithAttributes(attribute.String(attrName, name)))
	}
	m.lost.Add(context.Background(), 1, opts...)
}

// waitOutcomeOf classifies a failed acquire.
func waitOutcomeOf(ctx context.Context) waitOutcome {
	if ctx.Err() != nil {
		return waitCanceled
	}
	return waitError
}
