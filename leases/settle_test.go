package leases

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/slogtest"
	"github.com/pgfence/pgfence/migrations"
)

// A take is a call that grants a lease, for the tests of a grant whose
// caller gives up.
type take struct {
	name string
	take func(ctx context.Context, c *Client) (*Lease, error)
}

// takes are the calls that grant the lease "job".
var takes = []take{
	{"TryAcquire", func(ctx context.Context, c *Client) (*Lease, error) { return c.TryAcquire(ctx, "job", time.Minute) }},
	{"Acquire", func(ctx context.Context, c *Client) (*Lease, error) { return c.Acquire(ctx, "job", time.Minute) }},
}

// semaphoreTake takes a slot of semaphore "job" (lease "job#1").
var semaphoreTake = take{"Semaphore.Acquire", func(ctx context.Context, c *Client) (*Lease, error) {
	s, err := c.Semaphore("job", 1)
	if err != nil {
		return nil, err
	}
	return s.Acquire(ctx, time.Minute)
}}

// clientOver returns a client over url through driver ("pgx": a pgx
// pool; "pgbouncer": a pgx pool through PgBouncer in transaction pooling,
// in exec mode, which sends each statement's text; "database/sql": pgx's
// stdlib driver), with opts, closed when t ends. conn, if not nil, adjusts
// the connections' configuration.
func clientOver(t *testing.T, driver, url string, conn func(*pgxpool.Config), opts ...Option) *Client {
	t.Helper()
	if conn == nil {
		conn = func(*pgxpool.Config) {}
	}
	switch driver {
	case "pgx":
		return newClient(t, pgtest.PoolFor(t, url, conn), opts...)
	case "pgbouncer":
		b := pgtest.StartPgBouncer(t, url, pgtest.TransactionPooling)
		return newClient(t, pgtest.PoolFor(t, b.URL("postgres")+"&default_query_exec_mode=exec", conn), opts...)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	conn(cfg)
	db := stdlib.OpenDB(*cfg.ConnConfig)
	c, err := NewDB(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("after Close: %d connections in use", n)
		}
		_ = db.Close()
	})
	return c
}

// grantRunning counts the backends in admin's database that run a grant (of
// a lease or of a semaphore's slot) and, if waitEvent is not empty, wait on
// that event.
func grantRunning(t *testing.T, ctx context.Context, admin *pgxpool.Pool, waitEvent string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND state = 'active' AND query IN ($1, $2)
    AND ($3 = '' OR wait_event = $3)`, sqlGrant, sqlGrantSlot, waitEvent).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// liveHolder returns the owner of the live grant of "job" or of its
// semaphore's slot, or "".
func liveHolder(t *testing.T, ctx context.Context, admin *pgxpool.Pool) string {
	t.Helper()
	var owner string
	err := admin.QueryRow(ctx, `SELECT owner FROM pgfence.leases WHERE name IN ('job', 'job#1') AND expires_at > clock_timestamp()`).Scan(&owner)
	if err != nil && !errors.Is(err, errNoRows) {
		t.Fatal(err)
	}
	return owner
}

type taken struct {
	l   *Lease
	err error
}

// takeUntilCancelled runs call on c in a goroutine, cancels its context
// once waiting says the grant is under way, and returns its result.
func takeUntilCancelled(t *testing.T, ctx context.Context, c *Client, call func(context.Context, *Client) (*Lease, error), what string, waiting func() bool) taken {
	t.Helper()
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan taken, 1)
	go func() {
		l, err := call(gctx, c)
		done <- taken{l, err}
	}()
	pgtest.WaitFor(t, testTimeout, what, waiting)
	cancel()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		t.Fatal("the grant did not return after its context ended")
		return taken{}
	}
}

// standbyDown starts a migrated throwaway cluster whose commits wait for a
// synchronous standby that never connects. It returns the URL of its
// database, whose sessions' commits wait; an admin pool, whose sessions
// commit locally; and the test's context.
func standbyDown(t *testing.T) (string, *pgxpool.Pool, context.Context) {
	t.Helper()
	cluster := pgtest.StartCluster(t, pgtest.WithSetting("synchronous_standby_names", "nobody"))
	ctx := testContext(t)
	url := cluster.URL("postgres")
	local := url + "&synchronous_commit=local"
	if err := migrations.Up(ctx, local); err != nil {
		t.Fatal(err)
	}
	return url, pgtest.PoolFor(t, local), ctx
}

// standbyBack lets the commits of standbyDown's cluster through: no
// synchronous standby is needed any more.
func standbyBack(t *testing.T, ctx context.Context, admin *pgxpool.Pool) {
	t.Helper()
	for _, q := range []string{`ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelledGrantCommitted (scenario: the caller of a grant gives up
// while the grant's commit waits for a synchronous standby that is down —
// synchronous replication, as Patroni's synchronous mode runs it, with the
// standby gone). The cancel ends the wait but not the commit: PostgreSQL
// has committed locally and says so in a warning. Closing the connection
// at the end of ctx lost that answer, and the lease stayed held for its
// TTL by an owner nobody knew. The call must return the lease instead, or
// an error with nothing held; through PgBouncer too, which passes the
// cancel request on to the server connection the grant runs on.
func TestCancelledGrantCommitted(t *testing.T) {
	t.Parallel()
	for _, tk := range append(takes, semaphoreTake) {
		for _, driver := range []string{"pgx", "pgbouncer", "database/sql"} {
			t.Run(tk.name+"/"+driver, func(t *testing.T) {
				t.Parallel()
				url, admin, ctx := standbyDown(t)
				c := clientOver(t, driver, url, nil)

				r := takeUntilCancelled(t, ctx, c, tk.take, "the grant's commit to wait for the standby", func() bool {
					return grantRunning(t, ctx, admin, "SyncRep") > 0
				})
				standbyBack(t, ctx, admin)
				pgtest.WaitFor(t, testTimeout, "the grant's statement to end", func() bool { return grantRunning(t, ctx, admin, "") == 0 })
				holder := liveHolder(t, ctx, admin)
				if r.err != nil {
					if !errors.Is(r.err, context.Canceled) {
						t.Errorf("error %v does not match context.Canceled", r.err)
					}
					if holder != "" {
						t.Fatalf("%s returned %q, yet its grant committed: the lease is held by %q, whom nobody knows", tk.name, r.err, holder)
					}
					return
				}
				if holder != r.l.Owner() {
					t.Fatalf("%s returned the grant of %q; the live grant is %q's", tk.name, r.l.Owner(), holder)
				}
				t.Logf("%s returned the grant that committed after its context ended (fence %d)", tk.name, r.l.Fence())
				if err := r.l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// expiredHolderWriting returns a database where lease "job" was granted
// to a holder that froze with a fenced transaction open, on holder, and
// expired since: a grant of "job" waits for that transaction. It also
// returns an admin pool and the test's context.
func expiredHolderWriting(t *testing.T) (url string, admin *pgxpool.Pool, ctx context.Context, holder *pgxpool.Conn) {
	t.Helper()
	url, admin, ctx = protectedWork(t)
	holder = namedConn(t, ctx, url, "holder")
	openExpiringFencedWrite(t, ctx, freeze(newClient(t, admin)), holder, MinTTL)
	pgtest.WaitFor(t, testTimeout, "the holder's grant to expire", func() bool { return liveHolder(t, ctx, admin) == "" })
	return url, admin, ctx, holder
}

// TestCancelledGrantWaiting (scenario: the caller of a grant gives up while
// the grant waits for an expired holder's open fenced transaction). The
// call returns ctx's error only once the statement is over on the server —
// not with a backend still queued for the fence lock, which would take the
// lease when the holder commits — and nothing is held then or later.
func TestCancelledGrantWaiting(t *testing.T) {
	t.Parallel()
	for _, tk := range takes {
		for _, driver := range []string{"pgx", "database/sql"} {
			t.Run(tk.name+"/"+driver, func(t *testing.T) {
				t.Parallel()
				url, admin, ctx, holder := expiredHolderWriting(t)
				c := clientOver(t, driver, url, nil)

				r := takeUntilCancelled(t, ctx, c, tk.take, "the grant to wait for the fence lock", func() bool {
					return grantRunning(t, ctx, admin, "advisory") > 0
				})
				running := grantRunning(t, ctx, admin, "")
				if r.err == nil {
					t.Fatalf("%s granted %v behind an open fenced transaction", tk.name, r.l)
				}
				if !errors.Is(r.err, context.Canceled) {
					t.Errorf("error %v does not match context.Canceled", r.err)
				}
				if running != 0 {
					t.Errorf("%s returned %q with its statement still running on the server", tk.name, r.err)
				}
				if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
					t.Fatal(err)
				}
				pgtest.WaitFor(t, testTimeout, "the grant's statement to end", func() bool { return grantRunning(t, ctx, admin, "") == 0 })
				if h := liveHolder(t, ctx, admin); h != "" {
					t.Fatalf("after %s returned %q, the lease is held by %q, whom nobody knows", tk.name, r.err, h)
				}
			})
		}
	}
}

// TestCancelledGrantStatementLate (scenario: as TestCancelledGrantWaiting,
// but the caller gives up while the grant's statement is still on its way
// to the server). The cancel request arrives first, while the backend is
// idle, and the server ignores it; the statement then waits for the fence
// lock. The call must still return ctx's error soon after the statement
// arrives, with nothing in doubt. Before, it waited for the whole release
// timeout (15s here) and returned the grant in doubt, over pgx and
// database/sql; through PgBouncer (transaction pooling) it returned
// promptly already, and the subtest keeps it so.
func TestCancelledGrantStatementLate(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "pgbouncer", "database/sql"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			url, admin, ctx, holder := expiredHolderWriting(t)

			var wire pgtest.LateWrites
			c := clientOver(t, driver, url, func(cfg *pgxpool.Config) { cfg.ConnConfig.DialFunc = wire.Dial },
				WithReleaseTimeout(15*time.Second))

			const late = time.Second
			gctx, cancel := context.WithCancel(ctx)
			defer cancel()
			seen := wire.CancelWhenSent("pgfence.try_acquire(", late, cancel)
			start := time.Now()
			l, err := c.TryAcquire(gctx, "job", time.Minute)
			took := time.Since(start)
			if !<-seen {
				t.Fatal("the grant was never seen on the wire (is the connection encrypted?)")
			}
			if err == nil {
				t.Fatalf("TryAcquire granted %v behind an open fenced transaction", l)
			}
			if !errors.Is(err, context.Canceled) || errors.Is(err, errInDoubt) {
				t.Errorf("TryAcquire = %v; want context.Canceled, not in doubt", err)
			}
			// The statement arrives after late; cancelling it then takes
			// a round trip or two. 4s more is for a loaded machine, and
			// far from the 15s release timeout.
			if took > late+4*time.Second {
				t.Errorf("TryAcquire returned %v after its call, its statement %v late; want soon after the statement arrived", took.Round(time.Millisecond), late)
			}
			t.Logf("TryAcquire returned %v after its call, its statement %v late", took.Round(time.Millisecond), late)
			if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
				t.Fatal(err)
			}
			pgtest.WaitFor(t, testTimeout, "the grant's statement to end", func() bool { return grantRunning(t, ctx, admin, "") == 0 })
			if h := liveHolder(t, ctx, admin); h != "" {
				t.Fatalf("after TryAcquire returned %q, the lease is held by %q, whom nobody knows", err, h)
			}
		})
	}
}

// TestCancelledGrantUnanswered (scenario: as TestCancelledGrantCommitted,
// but the cancel request is lost, as through a proxy that drops it, or
// cannot be sent, as when the server or the way to it is down). The call
// still returns with ctx's error saying that the grant is in doubt, and
// logs it: after the release timeout when the request may have been
// delivered, at once when it was not. It leaves no connection acquired
// (newClient checks) or goroutine behind (TestMain checks).
func TestCancelledGrantUnanswered(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		cancelRequest func(context.Context) error
	}{
		{"lost", func(context.Context) error { return nil }},
		{"not sent", func(context.Context) error { return errors.New("connection refused") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url, admin, ctx := standbyDown(t)
			var logs slogtest.Buffer
			const wait = 3 * time.Second
			c := newClient(t, pgtest.PoolFor(t, url), WithReleaseTimeout(wait),
				WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			c.hooks.cancelRequest = tc.cancelRequest

			var cancelled time.Time
			r := takeUntilCancelled(t, ctx, c, takes[0].take, "the grant's commit to wait for the standby", func() bool {
				if grantRunning(t, ctx, admin, "SyncRep") == 0 {
					return false
				}
				cancelled = time.Now()
				return true
			})
			took := time.Since(cancelled)
			if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, errInDoubt) {
				t.Fatalf("TryAcquire = %v, %v; want an error matching context.Canceled and errInDoubt", r.l, r.err)
			}
			// Bounds: the release timeout when the request may have
			// arrived, with a loaded machine's slack above it; well
			// below it when it was not sent.
			if tc.name == "lost" && (took < wait || took > wait+10*time.Second) {
				t.Errorf("TryAcquire returned %v after its context ended; want the release timeout, %v", took, wait)
			}
			if tc.name == "not sent" && took >= wait {
				t.Errorf("TryAcquire returned %v after its context ended, with no cancel request sent; want well below the release timeout, %v", took, wait)
			}
			if !strings.Contains(logs.String(), "a cancelled grant is in doubt") {
				t.Errorf("nothing logged about the grant in doubt: %q", logs.String())
			}
			standbyBack(t, ctx, admin)
			pgtest.WaitFor(t, testTimeout, "the grant's statement to end", func() bool { return grantRunning(t, ctx, admin, "") == 0 })
		})
	}
}

// TestSettled: the outcome of a grant whose context ended while it ran is
// the server's answer, or in doubt when there was none.
func TestSettled(t *testing.T) {
	cancelled := &pgconn.PgError{Code: "57014"}
	for _, tc := range []struct {
		answered bool
		err      error
		want     error
	}{
		{true, nil, nil},
		{true, cancelled, cancelled},
		{true, errNoRows, errNoRows},
		{false, nil, errInDoubt},
		{false, cancelled, errInDoubt},
		{true, io.ErrUnexpectedEOF, errInDoubt}, // the connection broke before the answer
	} {
		if got := settled(tc.answered, tc.err); !errors.Is(got, tc.want) || (tc.want == nil) != (got == nil) {
			t.Errorf("settled(%v, %v) = %v, want %v", tc.answered, tc.err, got, tc.want)
		}
	}
}
