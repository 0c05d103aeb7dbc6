package pglock

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// A blocking acquire whose caller gives up must not leave a backend queued
// behind the holder. Closing the connection does not do it: a backend
// waiting for a lock does not read its socket, so it stays in the lock's
// queue until it is granted (and then holds the lock until it notices the
// closed socket). pgx sends a cancel request when it closes a connection,
// but from a background goroutine that a process on its way out never
// runs, over a new connection that a proxy or a broken network may lose.
// So the wait is ended explicitly, and Lock returns only when the server
// has confirmed it (or the unlock timeout has passed):
//
//  1. A deadline travels with the statement as its lock_timeout; the
//     server ends the wait by itself at the deadline.
//  2. Otherwise, or if that answer is late, pglock sends a cancel request
//     and waits for the statement's answer.
//  3. If the cancel request was lost, pglock cancels the waiting backend
//     from another of the pool's connections (pg_cancel_backend, only if
//     that backend is waiting for this very key, or one of the set's).
//  4. If nothing answers within the unlock timeout, the connection is
//     closed anyway; the server then ends the wait when it next looks at
//     the session.

// answerWait is how long an abandoned wait waits for the server's answer
// to end it (its own lock_timeout, then the cancel request) before trying
// the next way. An answer normally takes a round trip; the next way is
// harmless if the answer was only slow.
const answerWait = 250 * time.Millisecond

// wait runs the blocking acquire of keys on conn: of one key, shared or
// exclusive, or of several, exclusive, one after the other in the order
// given (one statement). If ctx ends before the statement does, it returns
// only after the wait is over on the server (see above), with abandoned
// true; the caller must then destroy conn, whatever err says. Of several
// keys, those before the one awaited are then held by conn's session, which
// is one more reason to destroy it. A wait the server refused by itself at
// ctx's deadline, or granted as it passed (refused), before anything was
// sent to end it is not abandoned: see keep. known is the pid of conn's
// session if it is proven (proven.go), or 0.
func (l *Locker) wait(ctx context.Context, conn *pgxpool.Conn, keys []int64, shared bool, known uint32) (pid uint32, abandoned bool, err error) {
	short := known != 0 && len(keys) == 1 // the statement returns the lock function's result only
	sql, arg := lockStatement(keys, shared, short)
	timeout := lockTimeout(ctx)
	finished := make(chan struct{})
	cleaned := make(chan struct{})
	var bySelf bool // written before cleaned closes
	stop := context.AfterFunc(ctx, func() {
		defer close(cleaned)
		byServer := timeout != nil && errors.Is(ctx.Err(), context.DeadlineExceeded)
		pg := conn.Conn().PgConn()
		var cancelRequest func(context.Context) error
		if !l.hooks.noCancelRequest {
			cancelRequest = pg.CancelRequest
		}
		bySelf = l.abandon(waiter{
			pid:           pg.PID(),
			keys:          keys,
			byServer:      byServer,
			finished:      finished,
			cancelRequest: cancelRequest,
			cancelBackend: func(ctx context.Context) (cancelled bool, err error) {
				err = l.pool.QueryRow(ctx, sqlCancelWaiter, int32(pg.PID()), keys).Scan(&cancelled)
				return cancelled, err
			},
			fail: func() { _ = pg.Conn().SetReadDeadline(aLongTimeAgo) },
		})
	})
	// The statement runs without ctx's cancellation: pgx would close the
	// connection at once and leave the backend waiting. abandon ends it.
	if short {
		pid = known
		err = conn.QueryRow(context.WithoutCancel(ctx), sql, arg, timeout).Scan(nil)
	} else {
		err = conn.QueryRow(context.WithoutCancel(ctx), sql, arg, timeout).Scan(&pid, nil)
	}
	close(finished)
	if timeout != nil && pgerr.Code(err) == pgerr.LockNotAvailable {
		// The server ended the wait at the deadline it was given (of
		// several keys, each wait may last that long: later, never
		// earlier); this process's timer for the same deadline may fire
		// a moment later on a loaded machine. It is the deadline either
		// way: once ctx has ended, the caller reports ctx's error
		// (ctxFirst) — also when stop below wins the race with ctx's
		// AfterFunc, which a context starts only after closing Done.
		<-ctx.Done()
	}
	if !stop() {
		<-cleaned
		if bySelf && err == nil {
			err = errLateGrant
		}
		return pid, !(bySelf && refused(err)), err
	}
	return pid, false, lateGrant(ctx, err)
}

// lateGrant returns errLateGrant for a grant (err nil) read after ctx
// ended, whose clean-up stop kept from starting: a context closes Done
// before it starts its AfterFunc callbacks, and a loaded machine can make
// that window longer than a round trip. Nothing was sent to end the wait,
// so the grant is given back (keep) like one that came as ctx ended; the
// caller gets ctx's error, as Lock's contract says.
func lateGrant(ctx context.Context, err error) error {
	if err == nil && ctx.Err() != nil {
		return errLateGrant
	}
	return err
}

// errLateGrant: the server granted a wait after ctx's deadline had passed
// for the client, and before its own lock_timeout, which carries the same
// deadline, fired (it starts when the statement arrives); or the grant was
// read after ctx ended (lateGrant). Nothing was sent to end the wait, so,
// like a refused one, the session may give the lock back and stay (keep);
// the caller gets ctx's error.
var errLateGrant = errors.New("granted as the context ended, and given back")

// refused reports whether err is the server's refusal of a wait, raised
// while it waited: its lock_timeout, a deadlock, a full lock table; or a
// grant that came as the deadline passed (errLateGrant). Only such a wait
// may keep its session, and only once keep has released what the session
// holds (see sqlReleaseAll).
func refused(err error) bool {
	if errors.Is(err, errLateGrant) {
		return true
	}
	switch pgerr.Code(err) {
	case pgerr.LockNotAvailable, pgerr.DeadlockDetected, pgerr.OutOfMemory:
		return true
	}
	return false
}

// lockStatement returns the blocking acquire of keys and its first
// argument; if short, of one key on a proven session (proven.go), the
// statement without the checks, which returns the lock function's result
// only.
func lockStatement(keys []int64, shared, short bool) (string, any) {
	switch {
	case len(keys) > 1:
		return sqlLockAll, keys
	case short && shared:
		return sqlLockSharedProven, keys[0]
	case short:
		return sqlLockProven, keys[0]
	case shared:
		return sqlLockShared, keys[0]
	}
	return sqlLock, keys[0]
}

// lockTimeout renders ctx's remaining time as a lock_timeout setting,
// rounded up to the millisecond, or nil when ctx has no deadline (or one
// beyond what lock_timeout can express).
func lockTimeout(ctx context.Context) *string {
	deadline, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	// Compared before rounding: a deadline beyond what a Duration reaches
	// (a "never" such as year 9999) saturates time.Until at its largest,
	// and adding to that would wrap to a negative timeout.
	left := time.Until(deadline)
	if left > math.MaxInt32*time.Millisecond {
		return nil
	}
	ms := (left + time.Millisecond - 1).Milliseconds()
	s := strconv.FormatInt(max(ms, 1), 10) + "ms" // 0 would mean no timeout
	return &s
}

// A waiter is an abandoned wait, as abandon needs it: the backend and keys
// it waits for, and the ways to end the wait, which differ between pgx and
// database/sql.
type waiter struct {
	pid      uint32
	keys     []int64
	byServer bool            // the statement carries the deadline as its lock_timeout
	finished <-chan struct{} // closed when the statement has returned

	// cancelRequest sends a cancel request for the statement (nil: there
	// is no way to); cancelBackend cancels it from another connection if
	// it waits for one of keys, and says whether it did; fail makes the
	// statement fail at once, client-side.
	cancelRequest func(ctx context.Context) error
	cancelBackend func(ctx context.Context) (cancelled bool, err error)
	fail          func()
}

// abandon ends the wait of w after its context ended. It returns when the
// statement has returned or the unlock timeout has passed; in the latter
// case it makes the statement fail (w.fail) and waits for it, at most
// dbx.FailWait: a driver that does not end a statement at its context's end
// (lib/pq on a silent network sends a cancel request and keeps reading)
// is left to return in the background. It reports whether the server
// ended the wait by itself (w.byServer) with nothing sent to end it: no
// cancel request that could still reach the session's next statement.
func (l *Locker) abandon(w waiter) (bySelf bool) {
	deadline := time.Now().Add(l.cfg.unlockTimeout)
	answered := func(d time.Duration) bool {
		t := time.NewTimer(max(d, 0))
		defer t.Stop()
		select {
		case <-w.finished:
			return true
		case <-t.C:
			return false
		}
	}
	if w.byServer {
		if answered(min(answerWait, time.Until(deadline))) {
			return true
		}
		if h := l.hooks.lateAnswer; h != nil {
			h()
		}
	}
	if w.cancelRequest != nil {
		cctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := w.cancelRequest(cctx)
		cancel()
		if err == nil && answered(min(answerWait, time.Until(deadline))) {
			return false
		}
	}
	// The cancel request was lost (or refused), or came before the
	// statement: a backend ignores one that arrives while it is idle,
	// and the statement may still be on its way. Cancel the backend from
	// another connection once it waits, retrying while the pool has no
	// connection to spare or the backend does not wait yet.
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, answerWait) {
		qctx, cancel := context.WithDeadline(context.Background(), deadline)
		cancelled, err := w.cancelBackend(qctx) // bounded by qctx over database/sql too (dbx.SQL)
		cancel()
		if err == nil && cancelled {
			if answered(time.Until(deadline)) {
				return false
			}
			break
		}
		if answered(min(pause, time.Until(deadline))) {
			return false
		}
		if !time.Now().Before(deadline) {
			break
		}
	}
	// Nothing answered: fail the statement now; the caller destroys the
	// connection.
	w.fail()
	t := time.NewTimer(dbx.FailWait)
	defer t.Stop()
	select {
	case <-w.finished:
	case <-t.C:
	}
	return false
}
