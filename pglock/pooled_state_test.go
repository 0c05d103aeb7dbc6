package pglock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// sessionStateSQL describes what a session carries from one borrower to
// the next: advisory locks it holds or awaits, its lock and statement
// timeouts, and the channels it listens on.
const sessionStateSQL = `
SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
       current_setting('lock_timeout'), current_setting('statement_timeout'),
       (SELECT count(*) FROM pg_listening_channels())`

// cleanSession fails t unless the session of q (the connection a pool of
// one hands out next) holds no advisory lock, is outside a transaction,
// has the server's default timeouts and listens on nothing.
func cleanSession(t *testing.T, what string, q dbx.Querier) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var (
		locks, listens int
		lockTimeout    string
		stmtTimeout    string
	)
	if err := q.QueryRow(ctx, sessionStateSQL).Scan(&locks, &lockTimeout, &stmtTimeout, &listens); err != nil {
		t.Fatalf("%s: read the next session's state: %v", what, err)
	}
	if locks != 0 || lockTimeout != "0" || stmtTimeout != "0" || listens != 0 {
		t.Errorf("%s: the next borrower's session holds %d advisory locks, lock_timeout %q, statement_timeout %q, %d LISTENs; want 0, \"0\", \"0\", 0",
			what, locks, lockTimeout, stmtTimeout, listens)
	}
}

// pooledCases are failure and success paths after which a pool of one
// connection must hand out a clean session.
func pooledCases(holder *Locker) []struct {
	name string
	run  func(ctx context.Context, l *Locker) error
} {
	return []struct {
		name string
		run  func(ctx context.Context, l *Locker) error
	}{
		{"lock with a deadline, unlock", func(ctx context.Context, l *Locker) error {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			lk, err := l.Lock(dctx, "a")
			if err != nil {
				return err
			}
			return lk.Unlock(ctx)
		}},
		{"rlock with a deadline, unlock", func(ctx context.Context, l *Locker) error {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			lk, err := l.RLock(dctx, "a")
			if err != nil {
				return err
			}
			return lk.Unlock(ctx)
		}},
		{"lock all with a deadline, unlock", func(ctx context.Context, l *Locker) error {
			dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			lk, err := l.LockAll(dctx, "a", "b", "c")
			if err != nil {
				return err
			}
			return lk.Unlock(ctx)
		}},
		{"try lock refused", func(ctx context.Context, l *Locker) error {
			held, err := holder.Lock(ctx, "held")
			if err != nil {
				return err
			}
			defer held.Unlock(ctx)
			if _, err := l.TryLock(ctx, "held"); !errors.Is(err, ErrLocked) {
				return fmt.Errorf("TryLock = %v, want ErrLocked", err)
			}
			return nil
		}},
		{"try lock all refused", func(ctx context.Context, l *Locker) error {
			held, err := holder.Lock(ctx, "held")
			if err != nil {
				return err
			}
			defer held.Unlock(ctx)
			if _, err := l.TryLockAll(ctx, "a", "held", "z"); !errors.Is(err, ErrLocked) {
				return fmt.Errorf("TryLockAll = %v, want ErrLocked", err)
			}
			return nil
		}},
		{"lock deadline while held elsewhere", pastDeadlineWhileHeld(holder, func(ctx context.Context, l *Locker) (*Lock, error) {
			return l.Lock(ctx, "held")
		})},
		{"rlock deadline while held elsewhere", pastDeadlineWhileHeld(holder, func(ctx context.Context, l *Locker) (*Lock, error) {
			return l.RLock(ctx, "held")
		})},
		{"lock all deadline while one is held elsewhere", pastDeadlineWhileHeld(holder, func(ctx context.Context, l *Locker) (*Lock, error) {
			return l.LockAll(ctx, "a", "held", "z")
		})},
		{"do with a failing fn", func(ctx context.Context, l *Locker) error {
			boom := errors.New("boom")
			if err := l.Do(ctx, "a", func(context.Context, *Lock) error { return boom }); !errors.Is(err, boom) {
				return fmt.Errorf("Do = %v, want boom", err)
			}
			return nil
		}},
		{"do with a panicking fn", func(ctx context.Context, l *Locker) (err error) {
			defer func() {
				if recover() == nil {
					err = errors.New("the panic did not propagate")
				}
			}()
			return l.Do(ctx, "a", func(context.Context, *Lock) error { panic("fn panicked") })
		}},
	}
}

// pastDeadlineWhileHeld is a pooled case: acquire, with a deadline of
// 200ms, while holder holds "held"; the call must fail with the deadline.
func pastDeadlineWhileHeld(holder *Locker, acquire func(ctx context.Context, l *Locker) (*Lock, error)) func(ctx context.Context, l *Locker) error {
	return func(ctx context.Context, l *Locker) error {
		held, err := holder.Lock(ctx, "held")
		if err != nil {
			return err
		}
		defer held.Unlock(ctx)
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := acquire(dctx, l); !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("acquire = %v, want DeadlineExceeded", err)
		}
		return nil
	}
}

// A pool of one connection hands the next borrower a clean session after
// every path through the Locker, over pgx.
func TestPooledSessionCleanPgx(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	ctx := testContext(t)
	holder := newLocker(t, newPool(t, u, 4))
	for _, c := range pooledCases(holder) {
		t.Run(c.name, func(t *testing.T) {
			pool := newPool(t, u, 1)
			l := newLocker(t, pool)
			if err := c.run(ctx, l); err != nil {
				t.Fatal(err)
			}
			cleanSession(t, c.name, pool)
		})
	}
}

// The same over database/sql, with one open connection.
func TestPooledSessionCleanDB(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	ctx := testContext(t)
	holder := newLocker(t, newPool(t, u, 4))
	for _, c := range pooledCases(holder) {
		t.Run(c.name, func(t *testing.T) {
			pool := newPool(t, u, 1)
			db := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
			t.Cleanup(func() { _ = db.Close() })
			db.SetMaxOpenConns(2) // one to lock, one to cancel an abandoned wait
			db.SetMaxIdleConns(2)
			l, err := NewDB(db)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.run(ctx, l); err != nil {
				t.Fatal(err)
			}
			checkAllIdle(t, c.name, db)
		})
	}
}

// checkAllIdle checks every idle connection of db.
func checkAllIdle(t *testing.T, what string, db *sql.DB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := db.Stats().Idle
	conns := make([]*sql.Conn, 0, n)
	for range n {
		sc, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, sc)
		cleanSession(t, what, dbx.SQL(sc))
	}
	for _, sc := range conns {
		_ = sc.Close()
	}
}
