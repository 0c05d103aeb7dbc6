package pglock

import (
	"context"
	"log/slog"
	"time"
)

// telemetry is the one place a Locker reports what happens: every metric
// and every log record goes through these methods, so that the
// measurements and the logs always tell the same story.
type telemetry struct {
	m   *metrics
	log *slog.Logger
}

// waitFailed records an acquire that began at start and ended without a
// lock.
func (t *telemetry) waitFailed(ctx context.Context, name string, md mode, o waitOutcome, start time.Time) {
	t.m.recordWait(ctx, name, md, o, start, time.Now())
}

// acquired records the grant of lk, asked for at start.
func (t *telemetry) acquired(ctx context.Context, lk *Lock, md mode, start time.Time) {
	t.m.recordWait(ctx, lk.logName, md, waitAcquired, start, lk.since)
	t.m.recordHeld(lk.shared, 1)
	if t.log.Enabled(ctx, slog.LevelDebug) {
		t.log.Debug("pglock: lock acquired", slog.String("name", lk.logName), lk.keyAttr(),
			slog.String("mode", modeName(lk.shared)), slog.Uint64("pid", uint64(lk.pid)),
			slog.Duration("waited", lk.since.Sub(start)))
	}
}

// unlocked records the end of lk's hold by Unlock, and returns when it
// ended, for logUnlocked. It calls no log handler: the caller logs once
// lk's Context has ended (see lost).
func (t *telemetry) unlocked(lk *Lock) time.Time {
	now := time.Now()
	t.m.recordHeld(lk.shared, -1)
	t.m.recordHold(lk.logName, lk.shared, false, lk.since, now)
	return now
}

// logUnlocked logs the end of lk's hold by Unlock at end.
func (t *telemetry) logUnlocked(lk *Lock, end time.Time) {
	if t.log.Enabled(context.Background(), slog.LevelDebug) {
		t.log.Debug("pglock: lock released", slog.String("name", lk.logName), lk.keyAttr(),
			slog.String("mode", modeName(lk.shared)), slog.Duration("held", end.Sub(lk.since)))
	}
}

// unlockFailed records an Unlock that Do ran and that failed; the
// connection was destroyed, which released the lock.
func (t *telemetry) unlockFailed(lk *Lock, err error) {
	t.log.Warn("pglock: unlock failed; its connection was closed, which released the lock",
		slog.String("name", lk.logName), lk.keyAttr(), slog.Any("err", err))
}

// lost records the end of lk's hold by loss, for reason why, and returns
// when it ended, for logLost. The metrics are recorded before lk's Context
// ends, so that whoever sees it done sees them; the log is written after
// (logLost): the handler is the application's, and one that stalls (a
// full pipe, a slow shipper) must not keep a lost lock looking held.
func (t *telemetry) lost(lk *Lock, why lostCause) time.Time {
	now := time.Now()
	t.m.recordHeld(lk.shared, -1)
	t.m.recordHold(lk.logName, lk.shared, true, lk.since, now)
	t.m.recordLost(lk.logName, lk.shared, why)
	return now
}

// logLost logs the loss of lk at end, for reason why (err, if not nil, is
// what showed it).
func (t *telemetry) logLost(lk *Lock, why lostCause, err error, end time.Time) {
	attrs := []any{
		slog.String("name", lk.logName), lk.keyAttr(), slog.Uint64("pid", uint64(lk.pid)),
		slog.String("cause", lostCauseNames[why]), slog.Duration("held", end.Sub(lk.since)),
	}
	if err != nil {
		attrs = append(attrs, slog.Any("err", err))
	}
	t.log.Warn("pglock: lock lost", attrs...)
}

// destroyed records that the connection of backend pid was closed because
// its lock state was in doubt. pid is 0 when it is unknown (a statement
// over database/sql that failed before it told its backend), and the
// record then has no pid.
func (t *telemetry) destroyed(name string, pid uint32, why string) {
	attrs := []any{slog.String("name", name)}
	if pid != 0 {
		attrs = append(attrs, slog.Uint64("pid", uint64(pid)))
	}
	t.log.Debug("pglock: connection destroyed", append(attrs, slog.String("why", why))...)
}

// keyAttr is the log attribute of the set's keys: key for one, keys for
// several (the first maxShownNames of a larger set, as its logName).
func (s lockSet) keyAttr() slog.Attr {
	if len(s.keys) == 1 {
		return slog.Int64("key", s.keys[0])
	}
	return slog.Any("keys", s.keys[:min(len(s.keys), maxShownNames)])
}
