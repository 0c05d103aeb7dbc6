package pglock

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// A Lock is a held session-scoped advisory lock. It pins one pooled
// connection until Unlock, or until the lock is lost. Its methods are safe
// for concurrent use.
type Lock struct {
	l      *Locker
	name   string
	key    int64
	shared bool
	pid    uint32    // backend of the pinned session, for logs
	since  time.Time // when the grant was seen, for the hold duration

	// ctx is cancelled, with cause ErrUnlocked or ErrLost, when the hold
	// ends; Done and Err read it.
	ctx    context.Context
	cancel context.CancelCauseFunc

	// The monitor starts monitorStartDelay after the grant, in the timer's
	// goroutine, and closes monitorDone when it returns.
	timer       *time.Timer
	monitorDone chan struct{}

	mu       sync.Mutex
	conn     *pgxpool.Conn // nil once handed back or destroyed
	stopping bool          // Unlock wants the connection back
	watching bool          // the monitor is blocked reading the socket
	lostErr  error         // why the lock was lost, nil if it was not

	unlockMu   sync.Mutex
	unlockDone bool
	unlockErr  error
}

// monitorStartDelay is how long after the grant the session monitor
// starts. Short holds (most of them) never pay for a monitor; a session
// killed during the delay is noticed when it ends.
const monitorStartDelay = 50 * time.Millisecond

func newLock(l *Locker, conn *pgxpool.Conn, name string, key int64, shared bool, since time.Time) *Lock {
	ctx, cancel := context.WithCancelCause(context.Background())
	lk := &Lock{
		l:           l,
		name:        name,
		key:         key,
		shared:      shared,
		since:       since,
		pid:         conn.Conn().PgConn().PID(),
		ctx:         ctx,
		cancel:      cancel,
		monitorDone: make(chan struct{}),
		conn:        conn,
	}
	lk.timer = time.AfterFunc(min(monitorStartDelay, l.cfg.interval), lk.monitor)
	return lk
}

// Name returns the lock's name.
func (lk *Lock) Name() string { return lk.name }

// Key returns the lock's key, Key(Name()): the bigint PostgreSQL sees in
// pg_locks (classid = high 32 bits, objid = low 32 bits, objsubid = 1).
func (lk *Lock) Key() int64 { return lk.key }

// Shared reports whether the lock is held in shared mode (RLock, TryRLock).
func (lk *Lock) Shared() bool { return lk.shared }

// Done returns a channel that is closed once the lock is no longer held:
// after Unlock, or when the lock is lost (see Err). A lost lock's Done
// closes within about a second of its backend being terminated, and within
// the liveness interval+timeout of the network going silent.
func (lk *Lock) Done() <-chan struct{} { return lk.ctx.Done() }

// Err returns nil while the lock is held, then ErrUnlocked or ErrLost.
func (lk *Lock) Err() error { return context.Cause(lk.ctx) }

// Unlock releases the lock and returns its connection to the pool.
//
// ctx bounds the unlock round trip (and nothing else: if a liveness check
// is in flight, Unlock first waits for it, at most the liveness timeout).
// If the round trip fails, or PostgreSQL answers that the session did not
// hold the lock, the connection is destroyed instead of returned, which
// releases any lock the session held, and Unlock returns an error. In every
// case, when Unlock returns the lock is no longer held by this process, Done
// is closed, and Err returns ErrUnlocked (or ErrLost if the lock had been
// lost before).
//
// Unlock after the lock was lost returns an error wrapping ErrLost. Unlock
// is safe to call more than once and concurrently: only the first call does
// any work, and every call returns the first call's result (nil after a
// clean unlock).
func (lk *Lock) Unlock(ctx context.Context) error {
	lk.unlockMu.Lock()
	defer lk.unlockMu.Unlock()
	if !lk.unlockDone {
		lk.unlockErr = lk.unlock(ctx)
		lk.unlockDone = true
	}
	return lk.unlockErr
}

func (lk *Lock) unlock(ctx context.Context) error {
	lk.stopMonitor()

	lk.mu.Lock()
	conn, lost := lk.conn, lk.lostErr
	lk.conn = nil
	lk.mu.Unlock()
	if conn == nil {
		return fmt.Errorf("pglock: unlock %q: %w: %v", lk.name, ErrLost, lost)
	}
	// Clear any deadline the monitor left on the socket.
	_ = conn.Conn().PgConn().Conn().SetDeadline(time.Time{})

	if ctx == nil {
		ctx = context.Background()
	}
	sql := sqlUnlock
	if lk.shared {
		sql = sqlUnlockShared
	}
	var released bool
	err := conn.QueryRow(ctx, sql, lk.key).Scan(&released)
	switch {
	case err != nil:
		destroy(conn, lk.l.cfg.log, "unlock failed", lk.name)
		lk.released(false)
		lk.cancel(ErrUnlocked)
		return fmt.Errorf("pglock: unlock %q: %w (its connection was closed, which releases the lock)", lk.name, err)
	case !released:
		// The session did not hold the lock: something outside pglock
		// released it. Nobody can trust what this session holds.
		destroy(conn, lk.l.cfg.log, "unlock returned false", lk.name)
		lk.released(true)
		lk.cancel(ErrUnlocked)
		return fmt.Errorf("pglock: unlock %q: %w: PostgreSQL reports the session did not hold it", lk.name, ErrLost)
	}
	conn.Release()
	lk.released(false)
	lk.cancel(ErrUnlocked)
	return nil
}

// released records the end of the hold by Unlock, before Done closes.
// notHeld says PostgreSQL
// answered that the session did not hold the lock: it had been lost
// unnoticed, which counts as a loss.
func (lk *Lock) released(notHeld bool) {
	now := time.Now()
	m := lk.l.m
	m.recordHold(lk.name, lk.shared, notHeld, lk.since, now)
	log := lk.l.cfg.log
	if notHeld {
		m.recordLost(lk.name, lk.shared, lostNotHeld)
		log.Warn("pglock: lock lost",
			slog.String("name", lk.name), slog.Int64("key", lk.key), slog.Uint64("pid", uint64(lk.pid)),
			slog.String("cause", lostCauseNames[lostNotHeld]), slog.Duration("held", now.Sub(lk.since)))
		return
	}
	if log.Enabled(context.Background(), slog.LevelDebug) {
		log.Debug("pglock: lock released", slog.String("name", lk.name), slog.Int64("key", lk.key),
			slog.String("mode", modeName(lk.shared)), slog.Duration("held", now.Sub(lk.since)))
	}
}
