package leases

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// WithReleaseTimeout takes [10ms, 1h], like pglock's WithUnlockTimeout;
// anything else is ErrInvalid naming the option.
func TestWithReleaseTimeoutBounds(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	for _, tc := range []struct {
		d  time.Duration
		ok bool
	}{
		{-time.Second, false},
		{0, false},
		{9 * time.Millisecond, false},
		{10 * time.Millisecond, true},
		{DefaultReleaseTimeout, true},
		{time.Hour, true},
		{time.Hour + time.Nanosecond, false},
	} {
		c, err := New(pool, WithReleaseTimeout(tc.d))
		switch {
		case tc.ok && err != nil:
			t.Errorf("WithReleaseTimeout(%v): %v, want no error", tc.d, err)
		case tc.ok:
			if c.cfg.releaseTimeout != tc.d {
				t.Errorf("WithReleaseTimeout(%v): release timeout %v", tc.d, c.cfg.releaseTimeout)
			}
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		case !errors.Is(err, ErrInvalid):
			t.Errorf("WithReleaseTimeout(%v): %v, want ErrInvalid", tc.d, err)
		case err.Error() != "leases: invalid option WithReleaseTimeout: timeout must be between 10ms and 1h0m0s, got "+tc.d.String():
			t.Errorf("WithReleaseTimeout(%v): message %q", tc.d, err)
		}
	}
	if got := defaultConfig().releaseTimeout; got != 5*time.Second {
		t.Errorf("default release timeout %v, want 5s", got)
	}
}

// A short release timeout bounds the release that Run does after fn, and
// Close's, when the lease row is locked by another transaction: each
// returns after about the timeout, not after the default 5s, and the
// grant is left to expire.
func TestWithReleaseTimeoutBoundsBlockedRelease(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	// Far below the default 5s, far above the timeout: generous, because
	// two shared cores run several packages' tests with -race at once.
	const bound = 3 * time.Second
	for _, tc := range []struct {
		name string
		// release holds the lease "job" on c, has lockRow lock its row, and
		// returns when the release under test began and its error.
		release func(ctx context.Context, c *Client, lockRow func()) (time.Time, error)
	}{
		{"Run", func(ctx context.Context, c *Client, lockRow func()) (time.Time, error) {
			var start time.Time
			err := c.Run(ctx, "job", time.Minute, func(context.Context, *Lease) error {
				lockRow()
				start = time.Now()
				return nil
			})
			return start, err
		}},
		{"Close", func(ctx context.Context, c *Client, lockRow func()) (time.Time, error) {
			if _, err := c.TryAcquire(ctx, "job", time.Minute); err != nil {
				return time.Now(), err
			}
			lockRow()
			start := time.Now()
			return start, c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			url := pgtest.URL(t)
			pool := pgtest.PoolFor(t, url)
			c, err := New(pgtest.PoolFor(t, url), WithReleaseTimeout(timeout))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() }) // Close's own result is the test's in one case
			blocker := lockingTx(t, pool)

			start, err := tc.release(ctx, c, func() { blocker.lock(ctx, "job") })
			took := time.Since(start)
			if took > bound {
				t.Errorf("release against a locked row took %v with a %v release timeout", took, timeout)
			}
			switch {
			case tc.name == "Run" && err != nil:
				t.Errorf("Run: %v, want fn's nil (the failed release is logged)", err)
			case tc.name == "Close" && !errors.Is(err, context.DeadlineExceeded):
				t.Errorf("Close: %v, want the release's deadline", err)
			}
			// It returned before it took effect: the grant is still live
			// while the row stays locked. (Its backend may end it once the
			// lock is gone.)
			if info, _, err := c.get(ctx, "job"); err != nil || info.Owner == "" {
				t.Errorf("after the timed-out release: %+v, %v; want the grant still live", info, err)
			}
			blocker.rollback(ctx)
		})
	}
}

// lockTx is an open transaction on a connection of its own that can lock a
// lease row, as a session blocking releases would.
type lockTx struct {
	t    *testing.T
	conn *pgxpool.Conn
}

func lockingTx(t *testing.T, pool *pgxpool.Pool) *lockTx {
	t.Helper()
	conn, err := pool.Acquire(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return &lockTx{t: t, conn: conn}
}

// lock locks the row of lease name until rollback.
func (x *lockTx) lock(ctx context.Context, name string) {
	x.t.Helper()
	if _, err := x.conn.Exec(ctx, `BEGIN`); err != nil {
		x.t.Fatal(err)
	}
	if _, err := x.conn.Exec(ctx, `SELECT 1 FROM pgfence.leases WHERE name = $1 FOR UPDATE`, name); err != nil {
		x.t.Fatal(err)
	}
}

func (x *lockTx) rollback(ctx context.Context) {
	x.t.Helper()
	if _, err := x.conn.Exec(ctx, `ROLLBACK`); err != nil {
		x.t.Fatal(err)
	}
}

// One lease whose row another transaction keeps locked does not keep Close
// from ending the others' grants: Close fails naming that lease alone, and
// its grant is the only one left live.
func TestCloseNotHeldUpByOneLockedRow(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	// The default release timeout, 5s: splitting the batch around the
	// locked row takes five lock waits of 100ms and the statements between,
	// and Close must get that far before the timeout even when two shared
	// cores run several packages' tests with -race.
	c, err := New(pgtest.PoolFor(t, url))
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := range n {
		if _, err := c.TryAcquire(ctx, fmt.Sprintf("job/%02d", i), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	blocker := lockingTx(t, pool)
	blocker.lock(ctx, "job/07")
	defer blocker.rollback(ctx)

	err = c.Close()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `1 of 20 rows locked by another transaction ("job/07")`) {
		t.Errorf("Close: %v; want the release's deadline, naming job/07 alone", err)
	}
	rows, err := pool.Query(ctx, `SELECT name FROM pgfence.leases WHERE expires_at > clock_timestamp() ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(live, []string{"job/07"}) {
		t.Errorf("grants live after Close: %q, want only the locked job/07's", live)
	}
}
