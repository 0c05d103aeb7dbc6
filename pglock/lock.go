package pglock

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// A Lock is a held session-scoped advisory lock, or a set of them taken
// together (LockAll). It pins one pooled connection until Unlock, or until
// the lock is lost. Its methods are safe for concurrent use, and safe to
// call on a nil *Lock (which holds nothing: Done is closed, Err and Unlock
// return an error matching ErrInvalid).
type Lock struct {
	l       *Locker
	lockSet // the names and keys held: one, or a set
	shared  bool
	pid     uint32    // backend of the pinned session, for logs
	since   time.Time // when the grant was seen, for the hold duration
	nc      net.Conn  // the pinned connection's socket, for deadlines; nil over database/sql

	// ctx is cancelled, with cause ErrUnlocked or ErrLost, when the hold
	// ends.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// The monitor goroutine (monitor.go), started by the Locker's starter
	// at due (starter.go), owns conn until it closes done; after that,
	// conn is Unlock's (at once if Unlock cancelled the start: see
	// monitorState). The monitor
	// returns when Unlock closes stop, or when it finds the session gone
	// (it then destroys conn and sets it to nil). Only Unlock closes stop,
	// and only the monitor closes done. mu orders the socket's deadlines
	// between the two (see stopMonitor).
	conn         *pgxpool.Conn
	sc           *sql.Conn // instead of conn over database/sql (dbsql.go)
	due          time.Time // when the starter starts the monitor
	monitorState atomic.Int32
	stop         chan struct{}
	done         chan struct{}
	mu           sync.Mutex

	unlockOnce sync.Once
	unlockErr  error
}

// monitorStartDelay is how long after the grant the session monitor
// starts watching. Short holds (most of them) never read the socket; a
// session killed during the delay is noticed when it ends.
const monitorStartDelay = 50 * time.Millisecond

func newLock(l *Locker, conn *pgxpool.Conn, s lockSet, shared bool, since time.Time) *Lock {
	lk := newHold(l, s, shared, conn.Conn().PgConn().PID(), since)
	lk.conn = conn
	lk.nc = conn.Conn().PgConn().Conn()
	l.schedule(lk)
	return lk
}

// newHold is what newLock and newLockDB share: a Lock of s, granted at
// since to backend pid, without its session and monitor.
func newHold(l *Locker, s lockSet, shared bool, pid uint32, since time.Time) *Lock {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lock{
		l:       l,
		lockSet: s,
		shared:  shared,
		since:   since,
		pid:     pid,
		ctx:     ctx,
		cancel:  cancel,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
}

// nilLock is what a nil *Lock answers: a context ended with an invalid
// input error.
var nilLock = func() context.Context {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(invalid("lock", "is nil"))
	return ctx
}()

// Name returns the lock's name. For a Lock of several names (LockAll,
// TryLockAll) it returns Names joined by ", ": a label, not a name to
// lock. Its log records, errors and metrics name a set of more than five
// by its first five names and how many more.
func (lk *Lock) Name() string {
	if lk == nil {
		return ""
	}
	return lk.label()
}

// Names returns the names the Lock holds, each once, in the order they
// were taken: by Key, then by name. A Lock from Lock, TryLock, RLock or
// TryRLock holds one. The slice is the caller's.
func (lk *Lock) Names() []string {
	if lk == nil {
		return nil
	}
	return slices.Clone(lk.names)
}

// Key returns the lock's key, Key(Name()): the bigint PostgreSQL sees in
// pg_locks (classid = high 32 bits, objid = low 32 bits, objsubid = 1).
// For a Lock of several names, Key(Names()[0]): the lowest of its keys.
func (lk *Lock) Key() int64 {
	if lk == nil {
		return 0
	}
	return lk.keys[0]
}

// Shared reports whether the lock is held in shared mode (RLock, TryRLock).
func (lk *Lock) Shared() bool { return lk != nil && lk.shared }

// Context returns a context that is cancelled, with a cause, the moment
// the lock is no longer held: ErrUnlocked after Unlock, ErrLost when the
// session died or stopped answering (within about a second of a
// terminated backend, within the liveness interval+timeout of a silent
// network). Do the lock's work under this context. It is not derived from
// the context passed to Lock.
func (lk *Lock) Context() context.Context {
	if lk == nil {
		return nilLock
	}
	return lk.ctx
}

// Done is closed when the lock is no longer held (Context().Done()).
func (lk *Lock) Done() <-chan struct{} { return lk.Context().Done() }

// Err returns nil while the lock is held, then ErrUnlocked or ErrLost
// (the cause of Context).
func (lk *Lock) Err() error { return context.Cause(lk.Context()) }

// Unlock releases the lock (every name of it) and returns its connection
// to the pool.
//
// ctx bounds the unlock round trip (and nothing else: if a liveness check
// is in flight, Unlock first waits for it, at most the liveness timeout);
// a nil ctx means the unlock timeout (WithUnlockTimeout). If the round
// trip fails, or PostgreSQL answers that the session did not hold the
// lock, the connection is destroyed instead of returned, which releases
// any lock the session held, and Unlock returns an error. In every case,
// when Unlock returns the lock is no longer held by this process and its
// Context has ended.
//
// Unlock after the lock was lost returns an error wrapping ErrLost, and so
// does an Unlock whose round trip finds the session gone (terminated, or
// its connection broken) before the monitor noticed: the lock was lost at
// some moment before, and its Context ends with ErrLost. Unlock is safe to
// call more than once and concurrently: only the first call does any work,
// and every call returns the first call's result.
func (lk *Lock) Unlock(ctx context.Context) error {
	if lk == nil {
		return invalid("lock", "is nil")
	}
	lk.unlockOnce.Do(func() { lk.unlockErr = lk.unlock(ctx) })
	return lk.unlockErr
}

func (lk *Lock) unlock(ctx context.Context) error {
	lk.stopMonitor()
	if lk.conn == nil && lk.sc == nil {
		return lk.opErr("unlock", context.Cause(lk.ctx)) // lost; the monitor said so
	}
	if lk.nc != nil {
		_ = lk.nc.SetDeadline(time.Time{}) // clear what the monitor left
	}
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), lk.l.cfg.unlockTimeout)
		defer cancel()
	}
	released, err := unlockKeys(ctx, lk.session(), lk.keys, lk.shared)
	switch {
	case err != nil && ctx.Err() == nil && !pgerr.StatementError(err):
		// The session was gone before the unlock reached it (terminated,
		// or its connection broken) and the monitor had not seen it yet:
		// the lock was lost, nobody knows when.
		lk.loseAt("session gone at unlock", lostSessionEnded, err)
		return lk.opErr("unlock", fmt.Errorf("%w: %w", ErrLost, err))
	case err != nil:
		lk.drop()
		end := lk.l.tel.unlocked(lk)
		lk.cancel(ErrUnlocked)
		lk.l.tel.destroyed(lk.logName, lk.pid, "unlock failed")
		lk.l.tel.logUnlocked(lk, end)
		return lk.opErr("unlock", err) // the connection was closed, which released the lock
	case !released:
		// The session did not hold the lock (or one of the set):
		// something outside pglock released it. Nobody can trust what
		// this session holds.
		lk.loseAt("unlock returned false", lostNotHeld, nil)
		return lk.opErr("unlock", ErrLost)
	}
	lk.giveBack()
	end := lk.l.tel.unlocked(lk)
	lk.cancel(ErrUnlocked)
	lk.l.tel.logUnlocked(lk, end) // after: see telemetry.lost
	return nil
}

// loseAt ends the hold because the session is gone or its lock state is
// in doubt (why, for the log): it closes the session, records the loss
// (for reason cause, shown by err if not nil) and ends the Lock's
// context with ErrLost, then logs all of it. The logs come last: the
// handler is the application's, and one that stalls must not keep a lost
// lock looking held (telemetry.lost).
func (lk *Lock) loseAt(why string, cause lostCause, err error) {
	lk.drop()
	end := lk.l.tel.lost(lk, cause) // before the context ends: whoever sees Done sees the metrics
	lk.cancel(ErrLost)
	lk.l.tel.destroyed(lk.logName, lk.pid, why)
	lk.l.tel.logLost(lk, cause, err, end)
}

// session is the pinned session, over pgx or database/sql.
func (lk *Lock) session() dbx.Querier {
	if lk.sc != nil {
		return dbx.SQL(lk.sc)
	}
	return lk.conn
}

// drop closes the pinned session, which releases every session lock it
// holds, because its lock state is in doubt; the Lock has none after. The
// caller logs it (telemetry.destroyed) once the Lock's context has ended.
func (lk *Lock) drop() {
	if sc := lk.sc; sc != nil {
		lk.sc = nil
		dbx.Discard(sc)
		return
	}
	conn := lk.conn
	lk.conn = nil
	dbx.Destroy(conn) // the socket too: see there
}

// giveBack returns the pinned session to its pool; the Lock has none
// after.
func (lk *Lock) giveBack() {
	if sc := lk.sc; sc != nil {
		lk.sc = nil
		_ = sc.Close() // back to db's pool
		return
	}
	conn := lk.conn
	lk.conn = nil
	conn.Release()
}
