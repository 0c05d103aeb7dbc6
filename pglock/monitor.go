package pglock

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// aLongTimeAgo is a deadline in the past: setting it makes a blocked read
// return at once with a timeout.
var aLongTimeAgo = time.Unix(1, 0)

// monitor is the Lock's one goroutine, started a short delay after the
// grant (starter.go): a lock held briefly (most are) costs no goroutine
// and no hand-off at Unlock, which cancels the start. Once running it owns
// the pinned connection until it returns, and it returns in exactly two
// ways: Unlock closed stop (the connection is then Unlock's), or the
// session is gone (it destroys the connection and ends the Lock's context
// with ErrLost). It closes done when it returns; nothing else does.
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
		return // Unlock came as the monitor started
	}
	pg := lk.conn.Conn().PgConn()
	cfg := lk.l.cfg
	for {
		if !lk.startWatch(cfg.interval) {
			return
		}
		if h := lk.l.hooks.watching; h != nil {
			h(lk)
		}
		err := pg.WaitForNotification(context.Background())
		switch {
		case err == nil:
			continue // a NOTIFY for a channel this session once LISTENed on
		case !isTimeout(err) || pg.IsClosed():
			lk.lose(lostSessionEnded, err)
			return
		case lk.stopped():
			return // stopMonitor cut the watch short
		}
		if !lk.probe(pg, cfg.timeout) {
			return
		}
	}
}

// startWatch sets the watch's read deadline, d from now, and reports true;
// or, once stop is closed, false.
func (lk *Lock) startWatch(d time.Duration) bool {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.stopped() {
		return false
	}
	_ = lk.nc.SetReadDeadline(time.Now().Add(d))
	return true
}

// probe runs the liveness check, one round trip bounded by timeout, and
// reports whether the session passed it; false also once stop is closed.
// It holds mu throughout, so that stopMonitor waits for it rather than cut
// it short (which would break the connection).
func (lk *Lock) probe(pg *pgconn.PgConn, timeout time.Duration) bool {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.stopped() {
		return false
	}
	_ = lk.nc.SetDeadline(time.Now().Add(timeout))
	if err := pg.Ping(context.Background()); err != nil {
		lk.lose(lostLivenessFailed, err)
		return false
	}
	_ = lk.nc.SetDeadline(time.Time{})
	return true
}

func (lk *Lock) stopped() bool {
	select {
	case <-lk.stop:
		return true
	default:
		return false
	}
}

// stopMonitor makes the monitor return and hand the connection back, and
// waits until it has: at once if it has not started (it never will) or is
// watching, after the round trip if it is probing (bounded by the liveness
// timeout). Unlock calls it, once.
//
// It closes stop and cancels the monitor's start; if the monitor runs, it
// then, holding mu, sets a read deadline in the past. Over database/sql (no
// socket) it closes stop and waits for monitorDB. The
// monitor sets a watch's deadline only while holding mu and after checking
// stop: so either it sees stop and does not watch, or its watch, under way
// or about to begin, ends at once on this deadline. A probe holds mu, so
// the deadline never cuts one short.
func (lk *Lock) stopMonitor() {
	close(lk.stop)
	if lk.nc == nil { // over database/sql, where drop may have cleared sc
		<-lk.done // monitorDB: at once, or after a liveness query in flight
		return
	}
	if lk.monitorState.CompareAndSwap(monitorPending, monitorCancelled) {
		return // the monitor never started, and never will: conn is Unlock's
	}
	lk.mu.Lock()
	_ = lk.nc.SetReadDeadline(aLongTimeAgo)
	lk.mu.Unlock()
	<-lk.done
}

// lose ends the hold because the session is gone: it destroys the
// connection, records the loss and ends the Lock's context. Only the
// monitor calls it, while it owns the connection.
func (lk *Lock) lose(why lostCause, err error) {
	lk.loseAt("lock lost", why, err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
