package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lib/pq"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// TestLibpqGrantWhoseAnswerIsLost (scenario: the connection breaks after
// the server committed a grant and sent its row, before the client read it
// — a network cut, a proxy or pooler restarting — over lib/pq). lib/pq
// answers driver.ErrBadConn for any connection that broke, and on its pool
// database/sql then sends the statement again: the grant sent again found
// the lease held by the first, under the owner drawn for this very call,
// and reported it held ("held by ..."); the lease stayed held by nobody
// until its TTL, and Acquire waited that long for itself. The call must
// fail and leave nothing held, or return the live grant: for a lease and a
// semaphore's slot, with a context that can end and one that cannot (the
// usual context.Background() of a job). The leases package's
// TestGrantWhoseAnswerIsLostIsEnded does the same over pgx and its stdlib
// driver.
func TestLibpqGrantWhoseAnswerIsLost(t *testing.T) {
	t.Parallel()
	takes := []struct {
		name string
		take func(ctx context.Context, c *leases.Client) (*leases.Lease, error)
	}{
		{"TryAcquire", func(ctx context.Context, c *leases.Client) (*leases.Lease, error) {
			return c.TryAcquire(ctx, "job", time.Minute)
		}},
		{"Acquire", func(ctx context.Context, c *leases.Client) (*leases.Lease, error) {
			return c.Acquire(ctx, "job", time.Minute)
		}},
		{"Semaphore.Acquire", func(ctx context.Context, c *leases.Client) (*leases.Lease, error) {
			s, err := c.Semaphore("job", 2)
			if err != nil {
				return nil, err
			}
			return s.Acquire(ctx, time.Minute)
		}},
	}
	for _, tk := range takes {
		for _, ends := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ends=%t", tk.name, ends), func(t *testing.T) {
				t.Parallel()
				x := newLostAnswerCase(t, ends)
				admin, ctx, callCtx, c, answers := x.admin, x.ctx, x.callCtx, x.c, x.answers

				lost := answers.Arm("pgfence.try_acquire")
				l, err := tk.take(callCtx, c)
				pgtest.MustHaveLost(t, lost, tk.name+"'s grant")
				var live int
				var holder string
				if err := admin.QueryRow(ctx, `SELECT count(*), coalesce(min(owner), '') FROM pgfence.leases
  WHERE (name = 'job' OR name LIKE 'job#%') AND expires_at > clock_timestamp()`).Scan(&live, &holder); err != nil {
					t.Fatal(err)
				}
				if err != nil {
					if live != 0 {
						t.Fatalf("%s failed (%v), yet %d grants are live, held by %q, whom nobody knows", tk.name, err, live, holder)
					}
					t.Logf("%s failed and left nothing held: %v", tk.name, err)
					return
				}
				if live != 1 || holder != l.Owner() {
					t.Fatalf("%s returned the grant of %q; %d grants are live, held by %q: want only the one returned", tk.name, l.Owner(), live, holder)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestLibpqReleaseWhoseAnswerIsLost (scenario: as
// TestLibpqGrantWhoseAnswerIsLost, for the answer to a release). The
// release sent again by database/sql found the grant it had ended gone:
// Release returned ErrLost, and Run returned it for a run that went well.
// Release may fail (its answer is lost), but must not report the lease
// lost, and Run must return fn's nil; the grant ends either way.
func TestLibpqReleaseWhoseAnswerIsLost(t *testing.T) {
	t.Parallel()
	for _, ends := range []bool{true, false} {
		t.Run(fmt.Sprintf("ends=%t", ends), func(t *testing.T) {
			t.Parallel()
			x := newLostAnswerCase(t, ends)
			admin, ctx, callCtx, c, answers := x.admin, x.ctx, x.callCtx, x.c, x.answers
			ended := func(name string) func() (bool, error) {
				return func() (bool, error) {
					row, ok, err := readLease(ctx, admin, name)
					return !(ok && row.live()), err
				}
			}

			l, err := c.TryAcquire(callCtx, "job", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			lost := answers.Arm(pgtest.ReleaseCall)
			err = l.Release(callCtx)
			pgtest.MustHaveLost(t, lost, "Release")
			if errors.Is(err, leases.ErrLost) {
				t.Errorf("Release whose answer was lost = %v; the lease was not lost", err)
			}
			t.Logf("Release = %v", err)
			mustWait(t, 30*time.Second, "the grant to end", ended("job"))

			err = c.Run(callCtx, "run", time.Minute, func(context.Context, *leases.Lease) error {
				lost = answers.Arm(pgtest.ReleaseCall)
				return nil
			})
			pgtest.MustHaveLost(t, lost, "Run's release")
			if err != nil {
				t.Errorf("Run whose fn returned nil, its release's answer lost = %v; want nil", err)
			}
			mustWait(t, 30*time.Second, "the run's grant to end", ended("run"))
		})
	}
}

// A lostAnswerCase is the set-up of one subtest above: a fresh database,
// an admin pool on it, a leases client over database/sql and lib/pq whose
// connections are dialled through answers (closed when t ends), the
// test's context, and the one the calls run with: the test's if ends,
// else one that cannot end.
type lostAnswerCase struct {
	admin        *pgxpool.Pool
	ctx, callCtx context.Context
	c            *leases.Client
	answers      *pgtest.LostAnswers
}

func newLostAnswerCase(t *testing.T, ends bool) lostAnswerCase {
	t.Helper()
	u := setup(t)
	x := lostAnswerCase{admin: newPool(t, u, "admin"), ctx: ctxT(t, time.Minute), callCtx: context.Background(), answers: new(pgtest.LostAnswers)}
	if ends {
		x.callCtx = x.ctx
	}
	connector, err := pq.NewConnector(u)
	if err != nil {
		t.Fatal(err)
	}
	connector.Dialer(lostDialer{x.answers})
	db := sql.OpenDB(connector)
	if x.c, err = leases.NewDB(db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := x.c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("after Close: %d connections in use", n)
		}
		_ = db.Close()
	})
	return x
}

// lostDialer is lib/pq's Dialer over a pgtest.LostAnswers.
type lostDialer struct{ a *pgtest.LostAnswers }

func (d lostDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return d.a.Dial(ctx, network, address)
}

func (d lostDialer) Dial(network, address string) (net.Conn, error) {
	return d.a.Dial(context.Background(), network, address)
}

func (d lostDialer) DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.a.Dial(ctx, network, address)
}
