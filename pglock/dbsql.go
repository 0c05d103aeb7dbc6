package pglock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// The database/sql path (NewDB). A Lock pins a *sql.Conn (db.Conn) instead
// of a pooled pgx connection; the lock statements, the destroy rule and
// the abandoned-wait rule are the same. What differs:
//
//   - destroying: database/sql has no Hijack. The Lock's *sql.Conn is
//     discarded by answering driver.ErrBadConn from Conn.Raw, which makes
//     database/sql close the driver connection (and so the server
//     session) instead of returning it to the pool, then closing it;
//   - loss detection: the socket is out of reach, so a goroutine sends a
//     liveness query (the driver's Ping) on the pinned connection every
//     liveness interval, bounded by the liveness timeout; a terminated
//     backend is noticed at the next one, not within milliseconds;
//   - an abandoned wait is cancelled from another of db's connections
//     (pg_cancel_backend, for this backend and key only); if that fails
//     until the unlock timeout, the statement's own context is cancelled,
//     which the driver turns into a cancel request (lib/pq) or a closed
//     socket (pgx's stdlib). The blocking calls therefore read the
//     session's backend pid first: one more round trip than over pgx;
//   - a driver that does not end a statement when its context ends (lib/pq
//     on a silent network sends a cancel request and keeps reading) is
//     not waited for: the liveness query's timeout loses the lock, an
//     abandoned wait returns at the unlock timeout (plus a second), and
//     the connection is discarded once the driver returns;
//   - no pooler check: a session whose answering backend differs from the
//     one first seen is not verified (connect directly or through
//     session pooling).

// NewDB returns a Locker over a database/sql handle, for applications that
// reach PostgreSQL through database/sql (pgx's stdlib driver or lib/pq;
// GORM's and sqlx's handles unwrap to one). Each held Lock pins one of
// db's connections (a *sql.Conn) until Unlock or loss, and a blocking
// acquire occupies one while it waits; cancelling an abandoned wait needs
// one more: keep db.SetMaxOpenConns above the locks held and awaited at
// once. A connection whose lock state is in doubt is closed, never
// returned to db's pool.
//
// Loss is detected by a liveness query on the pinned connection every
// liveness interval (WithLivenessCheck: 1s, timeout 3s by default), so a
// terminated backend ends the Lock's Context within interval + timeout
// rather than within milliseconds as over pgx. Everything else — the
// calls, errors, metrics and logs — is as for New, except that a
// transaction-mode pooler is not detected (ErrPooler is never returned).
//
// It fails, with an error matching ErrInvalid, on a nil db, a nil option
// or an invalid one; it does not touch the database.
func NewDB(db *sql.DB, opts ...Option) (*Locker, error) {
	if db == nil {
		return nil, invalid("db", "is nil")
	}
	l, err := configure(opts)
	if err != nil {
		return nil, err
	}
	l.db, l.q = db, dbx.SQL(db)
	return l, nil
}

// takeDB is take over database/sql.
func (l *Locker) takeDB(ctx context.Context, s lockSet, m mode) (*Lock, error) {
	start := time.Now()
	sc, err := l.db.Conn(ctx)
	if err != nil {
		l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
		return nil, s.opErr(m.op, fmt.Errorf("acquire connection: %w", err))
	}
	q := dbx.SQL(sc)
	var (
		pid       uint32
		taken     = len(s.keys)
		abandoned bool
	)
	if m.try {
		pid, taken, err = try(ctx, q, s.keys, m.shared, 0)
	} else {
		pid, abandoned, err = l.waitDB(ctx, sc, s.keys, m.shared, s.logName)
	}
	switch {
	case abandoned:
		l.tel.waitFailed(ctx, s.logName, m, waitCanceled, start)
		return nil, s.opErr(m.op, ctx.Err())
	case errors.Is(err, sql.ErrNoRows):
		_ = sc.Close()
		l.tel.waitFailed(ctx, s.logName, m, waitError, start)
		return nil, s.opErr(m.op, ErrStandby)
	case err != nil && l.keep(q, pid, err):
		_ = sc.Close()
		l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
		return nil, s.opErr(m.op, ctxFirst(ctx, err))
	case err != nil:
		l.discard(sc, s.logName, pid, "acquire failed")
		l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
		return nil, s.opErr(m.op, ctxFirst(ctx, err))
	case taken < len(s.keys):
		l.tel.waitFailed(ctx, s.logName, m, waitLocked, start)
		herr := refusal(ctx, q, s, taken, m.op)
		_ = sc.Close()
		return nil, herr
	}
	lk := newLockDB(l, sc, s, m.shared, pid, time.Now())
	l.tel.acquired(ctx, lk, m, start)
	return lk, nil
}

// waitDB is wait over database/sql: the blocking acquire of keys on sc,
// which returns, if ctx ends first, once the wait is over on the server
// (or, with a driver that does not end the statement, once abandon has
// given up on it), with abandoned true; sc is then discarded, once the
// statement has returned (database/sql cannot close a connection in use).
func (l *Locker) waitDB(ctx context.Context, sc *sql.Conn, keys []int64, shared bool, label string) (pid uint32, abandoned bool, err error) {
	q := dbx.SQL(sc)
	backend, err := dbx.BackendPID(ctx, q) // for cancelling the wait from another connection
	if err != nil {
		return 0, false, err
	}
	query, arg := lockStatement(keys, shared, false)
	timeout := lockTimeout(ctx)
	// The statement runs without ctx's cancellation (the driver would
	// close the connection, or send a cancel request that may be lost);
	// abandon ends it, and cancels stmtCtx only as its last resort.
	stmtCtx, cancelStmt := context.WithCancel(context.WithoutCancel(ctx))
	finished := make(chan struct{})
	cleaned := make(chan struct{})
	var bySelf bool // written before cleaned closes
	stop := context.AfterFunc(ctx, func() {
		defer close(cleaned)
		bySelf = l.abandon(waiter{
			pid:      backend,
			keys:     keys,
			byServer: timeout != nil && errors.Is(ctx.Err(), context.DeadlineExceeded),
			finished: finished,
			cancelBackend: func(ctx context.Context) (cancelled bool, err error) {
				err = l.q.QueryRow(ctx, sqlCancelWaiter, int32(backend), keys).Scan(&cancelled)
				return cancelled, err
			},
			fail: cancelStmt,
		})
	})
	var (
		granted uint32
		stmtErr error
	)
	go func() {
		defer cancelStmt()
		stmtErr = q.QueryRow(stmtCtx, query, arg, timeout).Scan(&granted, nil)
		close(finished)
	}()
	select {
	case <-finished:
	case <-cleaned: // abandon gave up before the statement returned
	}
	select {
	case <-finished:
	default:
		go func() {
			<-finished
			l.discard(sc, label, backend, "wait abandoned")
		}()
		return backend, true, ctx.Err()
	}
	pid, err = granted, stmtErr
	if err != nil {
		pid = backend // the session's, for keep and the logs
	}
	if timeout != nil && pgerr.Code(err) == pgerr.LockNotAvailable {
		<-ctx.Done() // the server's deadline is ctx's (see wait)
	}
	if !stop() {
		<-cleaned
		if bySelf && err == nil {
			err = errLateGrant
		}
		if bySelf && refused(err) {
			return backend, false, err // see wait
		}
		l.discard(sc, label, backend, "wait abandoned")
		return backend, true, err
	}
	return pid, false, lateGrant(ctx, err)
}

// discard closes sc's driver connection, and so its server session, which
// releases every session lock it may hold, instead of returning it to
// db's pool (dbx.Discard).
func (l *Locker) discard(sc *sql.Conn, name string, pid uint32, why string) {
	dbx.Discard(sc)
	l.tel.destroyed(name, pid, why)
}

func newLockDB(l *Locker, sc *sql.Conn, s lockSet, shared bool, pid uint32, since time.Time) *Lock {
	lk := newHold(l, s, shared, pid, since)
	lk.sc = sc
	go lk.monitorDB()
	return lk
}

// monitorDB is monitor over database/sql: every liveness interval, until
// Unlock closes stop, one liveness query on the pinned connection bounded
// by the liveness timeout. A failed one loses the lock: the connection is
// discarded and the Context ends with ErrLost. It owns sc until it closes
// done.
func (lk *Lock) monitorDB() {
	defer close(lk.done)
	cfg := lk.l.cfg
	t := time.NewTimer(cfg.interval)
	defer t.Stop()
	for {
		select {
		case <-lk.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
		pinged := make(chan error, 1)
		sc := lk.sc
		go func() { pinged <- sc.PingContext(ctx) }()
		var err error
		select {
		case err = <-pinged:
		case <-ctx.Done():
			// The driver has not ended the query at its deadline (lib/pq
			// on a silent network sends a cancel request and keeps
			// reading): the lock is lost now, and its connection is
			// discarded once the driver returns.
			lk.sc = nil
			go func() {
				<-pinged
				lk.l.discard(sc, lk.logName, lk.pid, "lock lost")
			}()
			end := lk.l.tel.lost(lk, lostLivenessFailed) // before the context ends, logged after it
			lk.cancel(ErrLost)
			lk.l.tel.logLost(lk, lostLivenessFailed, ctx.Err(), end)
			cancel()
			return
		}
		cancel()
		if err != nil {
			why := lostSessionEnded
			if errors.Is(err, context.DeadlineExceeded) {
				why = lostLivenessFailed
			}
			lk.lose(why, err)
			return
		}
		t.Reset(cfg.interval)
	}
}
