package pglock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/pgfence/pgfence/internal/dbx"
)

// A Locker takes session-scoped advisory locks over a pool. It is safe for
// concurrent use and holds no resources of its own: each held Lock pins one
// of the pool's connections until it is unlocked or lost, and a blocking
// acquire occupies one while it waits. Size the pool for the locks you hold
// and wait for at once, plus your other work.
type Locker struct {
	pool  *pgxpool.Pool // nil over database/sql (NewDB)
	db    *sql.DB       // nil over pgx (New)
	q     dbx.Querier   // pool, or db adapted: List, Get, and cancelling waits
	cfg   config
	tel   telemetry
	hooks hooks

	starter starter // starts the Locks' monitors (starter.go)
}

// New returns a Locker over pool. It fails, with an error matching
// ErrInvalid that names the argument, on a nil pool, a nil option or an
// invalid one; it does not touch the database.
func New(pool *pgxpool.Pool, opts ...Option) (*Locker, error) {
	if pool == nil {
		return nil, invalid("pool", "is nil")
	}
	l, err := configure(opts)
	if err != nil {
		return nil, err
	}
	l.pool, l.q = pool, pool
	return l, nil
}

// configure builds a Locker from opts, without its database.
func configure(opts []Option) (*Locker, error) {
	cfg := defaultConfig()
	for i, o := range opts {
		if o == nil {
			return nil, invalid("option", fmt.Sprintf("option %d is nil", i))
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	mp := cfg.meter
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return &Locker{
		cfg:   cfg,
		tel:   telemetry{m: newMetrics(mp, cfg.nameAttr, cfg.log), log: cfg.log},
		hooks: hooks{monitorDelay: monitorStartDelay},
	}, nil
}

// mode says what an acquire asks PostgreSQL for.
type mode struct {
	op     string // for messages
	shared bool
	try    bool
}

var (
	modeLock     = mode{op: "lock"}
	modeTryLock  = mode{op: "try lock", try: true}
	modeRLock    = mode{op: "rlock", shared: true}
	modeTryRLock = mode{op: "try rlock", shared: true, try: true}
)

// Lock takes the exclusive lock name, waiting while another session holds
// it in any mode.
//
// ctx bounds the wait. If ctx ends first, Lock returns an error wrapping
// ctx's error, and it returns only once the server has ended the wait:
// with a deadline, the statement carries it as its lock_timeout, so the
// server ends the wait by itself; otherwise (and if that answer is late)
// Lock sends a cancel request, and if that is lost, cancels the waiting
// backend from another of the pool's connections. The clean-up is bounded
// by the unlock timeout (WithUnlockTimeout, 5s by default). The connection
// that waited is then destroyed: the lock may have been granted at the
// very moment the wait was abandoned.
//
// On success the caller must call Unlock (or use Do). Two Lock calls on one
// name exclude each other, in one process as across processes, because
// each uses its own session.
func (l *Locker) Lock(ctx context.Context, name string) (*Lock, error) {
	return l.acquire(ctx, name, modeLock)
}

// TryLock takes the exclusive lock name if no other session holds it in any
// mode. Otherwise it returns at once a *HeldError (matching ErrLocked)
// naming the holders. ctx bounds the call; on any failure no lock is held
// and no connection kept.
func (l *Locker) TryLock(ctx context.Context, name string) (*Lock, error) {
	return l.acquire(ctx, name, modeTryLock)
}

// RLock takes the lock name in shared mode, waiting while another session
// holds it exclusively. Shared holders do not exclude each other. ctx is
// honoured as in Lock.
func (l *Locker) RLock(ctx context.Context, name string) (*Lock, error) {
	return l.acquire(ctx, name, modeRLock)
}

// TryRLock takes the lock name in shared mode if no other session holds it
// exclusively, and otherwise returns at once a *HeldError (matching
// ErrLocked).
func (l *Locker) TryRLock(ctx context.Context, name string) (*Lock, error) {
	return l.acquire(ctx, name, modeTryRLock)
}

func (l *Locker) acquire(ctx context.Context, name string, m mode) (*Lock, error) {
	if l == nil {
		return nil, invalid("locker", "is nil")
	}
	if err := checkCall(ctx, name); err != nil {
		return nil, err
	}
	return l.take(ctx, oneName(name), m)
}

// take acquires the session locks of s in mode m on one pooled connection
// (several keys only exclusively).
func (l *Locker) take(ctx context.Context, s lockSet, m mode) (*Lock, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.opErr(m.op, err)
	}
	if l.db != nil {
		return l.takeDB(ctx, s, m)
	}
	start := time.Now()
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
		return nil, s.opErr(m.op, fmt.Errorf("acquire connection: %w", err))
	}
	var (
		pid       uint32
		taken     = len(s.keys) // of s.keys, those before taken are held
		abandoned bool
		pg        = conn.Conn().PgConn()
		known     = proven(pg) // the session's pid, if proven
	)
	switch {
	case !m.try:
		pid, abandoned, err = l.wait(ctx, conn, s.keys, m.shared, known)
	default:
		pid, taken, err = try(ctx, conn, s.keys, m.shared, known)
	}
	switch {
	case abandoned:
		// ctx ended during the wait, and the server has ended it (see
		// wait). Even a grant that raced the cancellation is given up.
		l.destroy(conn, s.logName, "wait abandoned")
		l.tel.waitFailed(ctx, s.logName, m, waitCanceled, start)
		return nil, s.opErr(m.op, ctx.Err())
	case errors.Is(err, pgx.ErrNoRows):
		// A standby: the lock function never ran, the session holds nothing.
		conn.Release()
		l.tel.waitFailed(ctx, s.logName, m, waitError, start)
		return nil, s.opErr(m.op, ErrStandby)
	case err != nil && !pg.IsClosed() && pg.TxStatus() == 'I' && l.keep(conn, pg.PID(), err):
		conn.Release()
		l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
		return nil, s.opErr(m.op, ctxFirst(ctx, err))
	case err != nil:
		// The statement may have been granted as it failed: the lock
		// state of this session is unknown, so the session goes.
		l.destroy(conn, s.logName, "acquire failed")
		l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
		return nil, s.opErr(m.op, ctxFirst(ctx, err))
	case taken < len(s.keys):
		l.tel.waitFailed(ctx, s.logName, m, waitLocked, start)
		herr := refusal(ctx, conn, s, taken, m.op) // the statement gave the names back
		conn.Release()
		return nil, herr
	}
	// On a direct connection the answering backend is the one the
	// connection was opened to, and there is nothing to check: the session
	// is proven from now on. Through a pooler the pid differs (PgBouncer
	// hands clients keys of its own), and the lock must be shown to belong
	// to the session we still talk to (one key of a set shows it: one
	// statement took them all).
	switch {
	case pid == pg.PID():
		if known == 0 {
			prove(pg)
		}
	default:
		if err := verifySession(ctx, conn.Conn(), s.keys[0], m.shared); err != nil {
			// The lock went to a server session this connection may no
			// longer reach (a transaction-mode pooler: ErrPooler), or the
			// check failed: either way the lock state is in doubt, so the
			// session goes.
			l.destroy(conn, s.logName, "session check failed")
			l.tel.waitFailed(ctx, s.logName, m, waitOutcomeOf(ctx), start)
			return nil, s.opErr(m.op, err)
		}
	}
	lk := newLock(l, conn, s, m.shared, time.Now())
	l.tel.acquired(ctx, lk, m, start)
	return lk, nil
}

// try tries the session locks keys (several only exclusive) on q, and
// returns the answering backend and how many of keys it took: all, or the
// index of the refused one, in which case the session holds none of keys
// (the statement gave back those taken before it; if it could not, try
// returns errNotGivenBack). known is the pid of q's session if it is
// proven (proven.go), or 0.
func try(ctx context.Context, q dbx.Querier, keys []int64, shared bool, known uint32) (pid uint32, taken int, err error) {
	if len(keys) > 1 {
		var (
			n        int32
			gaveBack *bool
		)
		err = q.QueryRow(ctx, sqlTryLockAll, keys, false).Scan(&pid, &n, &gaveBack)
		if err == nil && gaveBack != nil && !*gaveBack {
			err = errNotGivenBack
		}
		return pid, int(n), err
	}
	granted := false
	switch {
	case known != 0:
		query := sqlTryLockProven
		if shared {
			query = sqlTryLockSharedProven
		}
		pid = known
		err = q.QueryRow(ctx, query, keys[0]).Scan(&granted)
	default:
		query := sqlTryLock
		if shared {
			query = sqlTryLockShared
		}
		err = q.QueryRow(ctx, query, keys[0]).Scan(&pid, &granted)
	}
	if !granted {
		return pid, 0, err
	}
	return pid, 1, err
}

// refusal reads, on q, who holds s.keys[taken], and returns the
// *HeldError (wrapped with the set when the set has several names).
func refusal(ctx context.Context, q dbx.Querier, s lockSet, taken int, op string) error {
	key := s.keys[taken]
	// Who holds it is read only now, on this path: the query reads
	// pg_locks, which would cost every successful try too.
	var held []byte
	if err := q.QueryRow(ctx, sqlHolders, key).Scan(&held); err != nil {
		held = nil // the error still says it is held; holders unknown
	}
	herr := &HeldError{Name: s.nameOf(key), Key: key, Holders: decodeHolders(held)}
	if len(s.names) > 1 {
		return s.opErr(op, herr)
	}
	return herr
}

// errNotGivenBack: a refused try of several keys could not give back the
// keys it took before the refused one; the session's lock state is in
// doubt.
var errNotGivenBack = errors.New("the names taken before the refused one were not all given back")

// unlockKeys releases the session locks keys (several only exclusive) held
// by conn's session, and reports whether PostgreSQL confirmed that the
// session held every one.
func unlockKeys(ctx context.Context, conn dbx.Querier, keys []int64, shared bool) (released bool, err error) {
	switch {
	case len(keys) > 1:
		err = conn.QueryRow(ctx, sqlUnlockAll, keys).Scan(&released)
	case shared:
		err = conn.QueryRow(ctx, sqlUnlockShared, keys[0]).Scan(&released)
	default:
		err = conn.QueryRow(ctx, sqlUnlock, keys[0]).Scan(&released)
	}
	return released, err
}

// keep reports whether a session whose acquire failed with err may go back
// to the pool: when the server refused a key while waiting for it
// (refused: its lock_timeout, a deadlock, a full lock table), or granted
// it only as ctx's deadline passed (errLateGrant), and the session, still
// backend pid, has given back every advisory lock it held (sqlReleaseAll:
// those of a set taken before the refused key, and the refused key itself
// when a lock_timeout fired as it was granted, or the grant). A wait
// abandoned at ctx's end never gets here unless the server refused it by
// itself before pglock sent anything to end it (wait), so no cancel
// request can reach the next borrower's statement. Keeping it saves a
// connection per timed-out wait; the release costs a round trip.
func (l *Locker) keep(q dbx.Querier, pid uint32, err error) bool {
	if !refused(err) || pid == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.unlockTimeout)
	defer cancel()
	var clean bool
	return q.QueryRow(ctx, sqlReleaseAll, int32(pid)).Scan(&clean) == nil && clean
}

// destroy takes conn out of the pool and closes its session, which releases
// every session-level advisory lock it may hold. It is used whenever the
// lock state of the session is in doubt.
func (l *Locker) destroy(conn *pgxpool.Conn, name, why string) {
	pid := conn.Conn().PgConn().PID()
	dbx.Destroy(conn) // the socket too: see there
	l.tel.destroyed(name, pid, why)
}
