package leases

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// sessionState describes what the session of the connection a pool of one
// hands out next carries from its last borrower: advisory locks, its
// transaction state, the settings the package's statements set for their
// own transaction (lock_timeout, synchronous_commit), the declared token,
// and LISTENs.
func sessionState(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var (
		locks, listens                 int
		lockTimeout, syncCommit, token string
	)
	err = conn.QueryRow(ctx, `
SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
       current_setting('lock_timeout'), current_setting('synchronous_commit'),
       coalesce(current_setting('pgfence.token', true), ''),
       (SELECT count(*) FROM pg_listening_channels())`).Scan(&locks, &lockTimeout, &syncCommit, &token, &listens)
	if err != nil {
		t.Fatalf("read the next session's state: %v", err)
	}
	return fmt.Sprintf("tx %c, %d advisory locks, lock_timeout %s, synchronous_commit %s, token %q, %d LISTENs",
		conn.Conn().PgConn().TxStatus(), locks, lockTimeout, syncCommit, token, listens)
}

// A Client over a pool of one connection hands the next borrower a clean
// session after each of its paths, failures included.
func TestPooledSessionClean(t *testing.T) {
	t.Parallel()
	url, pool, ctx := protectedWork(t)
	one := pgtest.PoolFor(t, url, func(c *pgxpool.Config) { c.MaxConns = 1 })
	const clean = "tx I, 0 advisory locks, lock_timeout 0, synchronous_commit on, token \"\", 0 LISTENs"
	if got := sessionState(t, one); got != clean {
		t.Fatalf("a new session: %s; the test's idea of clean is %s", got, clean)
	}
	c := newClient(t, one, WithNotifications(false), WithForceReleaseTimeout(300*time.Millisecond))
	other := newClient(t, pool)
	boom := errors.New("boom")
	for _, s := range []struct {
		name string
		run  func() error
	}{
		{"grant and release", func() error {
			l, err := c.TryAcquire(ctx, "a", time.Minute)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"held elsewhere", func() error {
			l, err := other.TryAcquire(ctx, "held", time.Minute)
			if err != nil {
				return err
			}
			defer l.Release(ctx)
			if _, err := c.TryAcquire(ctx, "held", time.Minute); !errors.Is(err, ErrHeld) {
				return fmt.Errorf("TryAcquire = %v, want ErrHeld", err)
			}
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			if _, err := c.Acquire(wctx, "held", time.Minute); !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("Acquire = %v, want its deadline", err)
			}
			return nil
		}},
		{"release after a minimum hold", func() error {
			l, err := c.TryAcquire(ctx, "a", time.Minute)
			if err != nil {
				return err
			}
			if err := l.HoldAtLeast(time.Millisecond); err != nil {
				return err
			}
			return l.Release(ctx)
		}},
		{"force-release blocked by a fenced transaction", func() error {
			l, err := other.TryAcquire(ctx, "fenced", time.Minute)
			if err != nil {
				return err
			}
			frozen := namedConn(t, ctx, url, "frozen-holder")
			openFencedWrite(t, ctx, frozen, l)
			defer func() { _, _ = frozen.Exec(ctx, `ROLLBACK`); _ = l.Release(ctx) }()
			if err := c.ForceRelease(ctx, "fenced"); !errors.Is(err, ErrBlocked) {
				return fmt.Errorf("ForceRelease = %v, want ErrBlocked", err)
			}
			return nil
		}},
		{"OnceTx with a failing fn", func() error {
			_, err := c.OnceTx(ctx, "job", "p1", time.Minute, func(context.Context, pgx.Tx, *Lease) error { return boom })
			if !errors.Is(err, boom) {
				return fmt.Errorf("OnceTx = %v, want fn's error", err)
			}
			return nil
		}},
		{"OnceTx with a panicking fn", func() (err error) {
			defer func() {
				if recover() == nil {
					err = errors.New("the panic did not propagate")
				}
			}()
			_, err = c.OnceTx(ctx, "job", "p2", time.Minute, func(context.Context, pgx.Tx, *Lease) error { panic("fn panicked") })
			return err
		}},
		{"Once done", func() error {
			_, err := c.Once(ctx, "job", "p3", time.Minute, func(context.Context, *Lease) error { return nil })
			return err
		}},
	} {
		if err := s.run(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := sessionState(t, one); got != clean {
			t.Errorf("after %s, the next borrower's session: %s; want %s", s.name, got, clean)
		}
	}
}
