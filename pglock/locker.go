package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
)

// A Locker takes session-scoped advisory locks over a pool. It is safe for
// concurrent use and holds no resources of its own: each held Lock pins one
// of the pool's connections until it is unlocked or lost, and a blocking
// acquire occupies one while it waits. Size the pool for the locks you hold
// and wait for at once, plus your other work.
type Locker struct {
	pool *pgxpool.Pool
	cfg  config
	m    *metrics
	err  error // nil pool or invalid option: returned by every call
}

// New returns a Locker over pool.
//
// New never fails and never panics: if pool is nil or an option is invalid,
// the Locker it returns answers every call with that error (ErrNilPool, or
// the option's message naming the setting), and takes no locks.
func New(pool *pgxpool.Pool, opts ...Option) *Locker {
	l := &Locker{pool: pool, cfg: defaultConfig()}
	if pool == nil {
		l.err = ErrNilPool
		return l
	}
	for i, o := range opts {
		if o == nil {
			l.err = fmt.Errorf("pglock: option %d is nil", i)
			return l
		}
		if err := o(&l.cfg); err != nil {
			l.err = err
			return l
		}
	}
	mp := l.cfg.meter
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	l.m = newMetrics(mp, l.cfg.nameAttr, l.cfg.log)
	return l
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
// ctx bounds the whole call, including the wait. If ctx ends while waiting,
// Lock returns an error wrapping ctx's error, and the connection it waited
// on is destroyed rather than returned to the pool: PostgreSQL may have
// granted the lock at the very moment of cancellation, and closing the
// session is the only way to be sure it is released.
//
// On success the caller must call Unlock (or use Do). Two Lock calls on one
// name exclude each other, in one process as across processes, because
// each uses its own session.
func (l *Locker) Lock(ctx context.Context, name string) (*Lock, error) {
	return l.acquire(ctx, name, modeLock)
}

// TryLock takes the exclusive lock name if no other session holds it in any
// mode, and otherwise returns an error wrapping ErrLocked at once. ctx
// bounds the call; on any failure no lock is held and no connection kept.
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
// exclusively, and otherwise returns an error wrapping ErrLocked at once.
func (l *Locker) TryRLock(ctx context.Context, name string) (*Lock, error) {
	return l.acquire(ctx, name, modeTryRLock)
}

// DoUnlockTimeout bounds the Unlock that Do runs after fn returns. That
// Unlock runs even when ctx has ended (with context.WithoutCancel).
const DoUnlockTimeout = 10 * time.Second

// Do takes the exclusive lock name (waiting, as Lock), runs fn, and unlocks,
// also when fn panics.
//
// fn's context is cancelled when ctx is, and also when the lock is lost; its
// cause (context.Cause) is then ErrLost. Do returns fn's error joined with
// the Unlock's error; if the lock was lost while fn ran, the result wraps
// ErrLost even when fn returned nil, so the caller knows its critical
// section was not exclusive to the end.
func (l *Locker) Do(ctx context.Context, name string, fn func(ctx context.Context) error) (err error) {
	if fn == nil {
		if l.err != nil {
			return l.err
		}
		return errors.New("pglock: do: fn is nil")
	}
	lk, err := l.Lock(ctx, name)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.ctx, func() { cancel(context.Cause(lk.ctx)) })
	defer func() {
		stop()
		cancel(nil)
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), DoUnlockTimeout)
		defer ucancel()
		err = errors.Join(err, lk.Unlock(uctx))
	}()
	return fn(fnCtx)
}

// check validates a call before anything is taken.
func (l *Locker) check(ctx context.Context, name string, op string) error {
	if l == nil {
		return fmt.Errorf("pglock: %s: %w", op, ErrNilPool)
	}
	if l.err != nil {
		return l.err
	}
	if err := validateName(name); err != nil {
		return fmt.Errorf("pglock: %s: %w", op, err)
	}
	if ctx == nil {
		return fmt.Errorf("pglock: %s %q: context is nil", op, name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pglock: %s %q: %w", op, name, err)
	}
	return nil
}

func (l *Locker) acquire(ctx context.Context, name string, m mode) (*Lock, error) {
	if err := l.check(ctx, name, m.op); err != nil {
		return nil, err
	}
	key := Key(name)
	start := time.Now()
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		l.m.recordWait(ctx, name, m, waitOutcomeOf(ctx), start, time.Now())
		return nil, fmt.Errorf("pglock: %s %q: acquire connection: %w", m.op, name, err)
	}
	granted := true
	var pid uint32
	switch {
	case m.try && m.shared:
		err = conn.QueryRow(ctx, sqlTryLockShared, key).Scan(&pid, &granted)
	case m.try:
		err = conn.QueryRow(ctx, sqlTryLock, key).Scan(&pid, &granted)
	case m.shared:
		err = conn.QueryRow(ctx, sqlLockShared, key).Scan(&pid, nil)
	default:
		err = conn.QueryRow(ctx, sqlLock, key).Scan(&pid, nil)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// A standby: the lock function never ran, the session holds nothing.
		conn.Release()
		l.m.recordWait(ctx, name, m, waitError, start, time.Now())
		return nil, fmt.Errorf("pglock: %s %q: %w", m.op, name, ErrStandby)
	}
	if err != nil {
		// The statement may have been granted as it was interrupted: the
		// lock state of this session is unknown, so the session goes.
		destroy(conn, l.cfg.log, "acquire failed", name)
		l.m.recordWait(ctx, name, m, waitOutcomeOf(ctx), start, time.Now())
		return nil, fmt.Errorf("pglock: %s %q: %w", m.op, name, err)
	}
	now := time.Now()
	if !granted {
		conn.Release() // PostgreSQL said no: this session holds nothing new.
		l.m.recordWait(ctx, name, m, waitLocked, start, now)
		return nil, fmt.Errorf("%w: %q", ErrLocked, name)
	}
	// On a direct connection the answering backend is the one the
	// connection was opened to, and there is nothing to check. Through a
	// pooler the pid differs (PgBouncer hands clients keys of its own), and
	// the lock must be proven to belong to the session we still talk to.
	if pid != conn.Conn().PgConn().PID() {
		if err := verifySession(ctx, conn.Conn(), key, m.shared); err != nil {
			// The lock went to a server session this connection may no
			// longer reach (a transaction-mode pooler: ErrPooler), or the
			// check failed: either way the lock state is in doubt, so the
			// session goes.
			destroy(conn, l.cfg.log, "session check failed", name)
			l.m.recordWait(ctx, name, m, waitOutcomeOf(ctx), start, time.Now())
			return nil, fmt.Errorf("pglock: %s %q: %w", m.op, name, err)
		}
	}
	l.m.recordWait(ctx, name, m, waitAcquired, start, now)
	lk := newLock(l, conn, name, key, m.shared, now)
	if l.cfg.log.Enabled(ctx, slog.LevelDebug) {
		l.cfg.log.Debug("pglock: lock acquired", slog.String("name", name), slog.Int64("key", key),
			slog.String("mode", modeName(m.shared)), slog.Uint64("pid", uint64(lk.pid)), slog.Duration("waited", now.Sub(start)))
	}
	return lk, nil
}

// destroyCloseTimeout bounds the polite close (Terminate message) of a
// destroyed connection; the socket is closed regardless.
const destroyCloseTimeout = time.Second

// destroy takes conn out of the pool and closes its session, which releases
// every session-level advisory lock it may hold. It is used whenever the
// lock state of the session is in doubt.
func destroy(conn *pgxpool.Conn, log *slog.Logger, why, name string) {
	pid := conn.Conn().PgConn().PID()
	c := conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), destroyCloseTimeout)
	_ = c.Close(ctx) // the socket is closed even if this reports an error
	cancel()
	log.Debug("pglock: connection destroyed", slog.String("name", name), slog.Uint64("pid", uint64(pid)), slog.String("why", why))
}
