package pglock

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"time"
)

// aLongTimeAgo is a deadline in the past: setting it makes a blocked read
// return at once with a timeout.
var aLongTimeAgo = time.Unix(1, 0)

// monitor watches the pinned session while the lock is held. It alternates
// two phases:
//
//   - watch: block reading the socket for up to the liveness interval. An
//     idle session receives nothing, so anything that ends the read other
//     than the deadline is the end of the session: a terminated backend
//     sends a FATAL ErrorResponse (57P01) and closes, a crashed server
//     closes or resets.
//   - probe: after a quiet interval, one empty-query round trip with the
//     liveness timeout, which catches a network that went silent.
//
// It uses socket deadlines, not contexts, so it never depends on the pool's
// context-watcher configuration and never sends a cancel request. Unlock
// stops it (stopMonitor) before using the connection; the monitor never
// touches the connection after seeing stopping.
func (lk *Lock) monitor() {
	defer close(lk.monitorDone)
	lk.mu.Lock()
	if lk.stopping {
		lk.mu.Unlock()
		return
	}
	// lk.conn stays set until we return: only lose (below) and Unlock
	// (after we return) clear it.
	pg := lk.conn.Conn().PgConn()
	lk.mu.Unlock()
	nc := pg.Conn()
	cfg := lk.l.cfg
	for {
		lk.mu.Lock()
		if lk.stopping {
			lk.mu.Unlock()
			return
		}
		lk.watching = true
		_ = nc.SetReadDeadline(time.Now().Add(cfg.interval))
		lk.mu.Unlock()

		err := pg.WaitForNotification(context.Background())

		lk.mu.Lock()
		lk.watching = false
		stopping := lk.stopping
		lk.mu.Unlock()
		if err == nil {
			continue // a NOTIFY for a channel this session once LISTENed on
		}
		if !isTimeout(err) || pg.IsClosed() {
			lk.lose(lostSessionEnded, err)
			return
		}
		if stopping {
			return
		}
		_ = nc.SetDeadline(time.Now().Add(cfg.timeout))
		if err := pg.Ping(context.Background()); err != nil {
			lk.lose(lostLivenessFailed, err)
			return
		}
		_ = nc.SetDeadline(time.Time{})
	}
}

// stopMonitor makes the monitor hand the connection back and waits until it
// has: at once if it is watching, after the round trip if it is probing
// (bounded by the liveness timeout). It is safe to call more than once.
func (lk *Lock) stopMonitor() {
	lk.mu.Lock()
	lk.stopping = true
	if lk.watching && lk.conn != nil {
		_ = lk.conn.Conn().PgConn().Conn().SetReadDeadline(aLongTimeAgo)
	}
	lk.mu.Unlock()
	if lk.timer.Stop() {
		close(lk.monitorDone) // it never started and now never will
	} else {
		<-lk.monitorDone // it started (or a previous call stopped it); wait for it
	}
}

// lose records that the session is gone, destroys the connection, closes
// Done, records the metrics and logs. Only the monitor calls it, and only
// before Unlock has taken the connection.
func (lk *Lock) lose(why lostCause, cause error) {
	lk.mu.Lock()
	conn := lk.conn
	lk.conn = nil
	lk.lostErr = cause
	lk.mu.Unlock()
	destroy(conn, lk.l.cfg.log, "lock lost", lk.name)
	// Recorded before Done closes, so that whoever sees Done sees them.
	now := time.Now()
	lk.l.m.recordHold(lk.name, lk.shared, true, lk.since, now)
	lk.l.m.recordLost(lk.name, lk.shared, why)
	lk.cancel(ErrLost)
	lk.l.cfg.log.Warn("pglock: lock lost",
		slog.String("name", lk.name), slog.Int64("key", lk.key),
		slog.Uint64("pid", uint64(lk.pid)), slog.String("cause", lostCauseNames[why]),
		slog.Duration("held", now.Sub(lk.since)), slog.Any("err", cause))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
