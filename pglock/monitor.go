package pglock

import (
	"context"
	"errors"
	"net"
	"time"
)

// aLongTimeAgo is a deadline in the past: setting it makes a blocked read
// return at once with a timeout.
var aLongTimeAgo = time.Unix(1, 0)

// monitor is the Lock's one goroutine, started by the Lock's timer after a
// short delay (so that a lock held briefly costs no goroutine and no
// hand-off at Unlock: Unlock stops the timer). Once started it owns the
// pinned connection until it returns, and it returns in exactly two ways:
// Unlock closed stop (the connection is then Unlock's), or the session is
// gone (it destroys the connection and ends the Lock's context with
// ErrLost). done closes when it has returned.
//
// It alternates two phases:
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
// context-watcher configuration and never sends a cancel request.
func (lk *Lock) monitor() {
	defer close(lk.done)
	if lk.stopped() {
		return
	}
	pg := lk.conn.Conn().PgConn()
	cfg := lk.l.cfg
	for {
		lk.watching.Store(true)
		_ = lk.nc.SetReadDeadline(time.Now().Add(cfg.interval))
		if lk.stopped() { // checked after the deadline is set: see stopMonitor
			lk.watching.Store(false)
			return
		}
		err := pg.WaitForNotification(context.Background())
		lk.watching.Store(false)
		switch {
		case err == nil:
			continue // a NOTIFY for a channel this session once LISTENed on
		case !isTimeout(err) || pg.IsClosed():
			lk.lose(lostSessionEnded, err)
			return
		case lk.stopped():
			return
		}
		_ = lk.nc.SetDeadline(time.Now().Add(cfg.timeout))
		if err := pg.Ping(context.Background()); err != nil {
			lk.lose(lostLivenessFailed, err)
			return
		}
		_ = lk.nc.SetDeadline(time.Time{})
	}
}

func (lk *Lock) stopped() bool {
	select {
	case <-lk.stop:
		return true
	default:
		return false
	}
}

// stopMonitor makes the monitor hand the connection back and waits until it
// has: at once if it is waiting to start or watching, after the round trip
// if it is probing (bounded by the liveness timeout). Safe to repeat.
//
// The monitor sets its read deadline before it checks stop, and stop is
// closed here before watching is read: so either the monitor sees stop
// and does not read, or this sees watching and cuts the read short.
func (lk *Lock) stopMonitor() {
	lk.stopOnce.Do(func() {
		close(lk.stop)
		if lk.timer.Stop() {
			close(lk.done) // the monitor never started, and now never will
		}
	})
	if lk.watching.Load() {
		_ = lk.nc.SetReadDeadline(aLongTimeAgo)
	}
	<-lk.done
}

// lose ends the hold because the session is gone: it destroys the
// connection, records the loss and ends the Lock's context. Only the
// monitor calls it, while it owns the connection.
func (lk *Lock) lose(why lostCause, err error) {
	conn := lk.conn
	lk.conn = nil
	lk.l.destroy(conn, lk.label, "lock lost")
	lk.l.tel.lost(lk, why, err) // before the context ends: whoever sees Done sees the metrics
	lk.cancel(ErrLost)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
