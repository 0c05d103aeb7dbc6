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

// A grant whose answer is lost on the way: the connection breaks after the
// server committed the grant and sent its row, before the client read it.
// The grant is held under an owner only this attempt knew; left alone it
// stays held, by nobody, until its TTL. In the simple protocol, pgx before
// 5.13 reported that failure as safe to retry (the "conn closed" of its
// second read of the closed connection): the Client took it for a
// statement never sent and did not end the grant (endUnread), and over
// database/sql pgx's stdlib driver turned it into driver.ErrBadConn, on
// which database/sql sends the statement again (Acquire then waited for
// its own lost grant to expire). The call must fail and leave nothing
// held, or return the grant that is live: over pgx and database/sql, in
// the extended and the simple protocol, for a lease and a semaphore's
// slot, with a context that can end (the grant then runs on a connection
// of its own, settle.go) and with one that cannot.
func TestGrantWhoseAnswerIsLostIsEnded(t *testing.T) {
	t.Parallel()
	type variant struct {
		take   take
		driver string
		mode   pgx.QueryExecMode
		ends   bool // the call's context can end
	}
	var variants []variant
	for _, tk := range []take{takes[0], semaphoreTake} {
		for _, driver := range []string{"pgx", "database/sql"} {
			for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
				variants = append(variants, variant{tk, driver, mode, true}, variant{tk, driver, mode, false})
			}
		}
	}
	for _, v := range variants {
		name := fmt.Sprintf("%s/%s/%s/ends=%t", v.take.name, v.driver, v.mode, v.ends)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			x := newLostAnswerCase(t, v.driver, v.mode, v.ends)
			admin, ctx, callCtx, c := x.admin, x.ctx, x.callCtx, x.c

			lost := x.answers.Arm("pgfence.try_acquire")
			l, err := v.take.take(callCtx, c)
			pgtest.MustHaveLost(t, lost, v.take.name+"'s grant")
			holder := liveHolder(t, ctx, admin)
			if err != nil {
				if holder != "" {
					t.Fatalf("%s failed (%v), yet a grant is live, held by %q, whom nobody knows", v.take.name, err, holder)
				}
				t.Logf("%s failed and left nothing held: %v", v.take.name, err)
			} else {
				if holder != l.Owner() {
					t.Fatalf("%s returned the grant of %q; the live grant is %q's", v.take.name, l.Owner(), holder)
				}
				if err := l.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			// Anyone can take it now.
			if l, err := v.take.take(ctx, newClient(t, admin)); err != nil {
				t.Errorf("%s by another client after the lost answer: %v", v.take.name, err)
			} else if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}

// A release whose answer is lost: as above, for the release's answer. The
// release may fail (the client cannot tell it committed), but must not
// report the lease lost, and Run, whose fn returned nil, must return nil;
// the grant ends either way. (Over lib/pq, database/sql sent the release
// again, and the copy found the grant gone: integration_test's
// TestLibpqReleaseWhoseAnswerIsLost.)
func TestReleaseWhoseAnswerIsLost(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "database/sql"} {
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
			for _, ends := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%s/ends=%t", driver, mode, ends), func(t *testing.T) {
					t.Parallel()
					x := newLostAnswerCase(t, driver, mode, ends)
					live := func() bool {
						t.Helper()
						var n int
						if err := x.admin.QueryRow(x.ctx, `SELECT count(*) FROM pgfence.leases WHERE expires_at > clock_timestamp()`).Scan(&n); err != nil {
							t.Fatal(err)
						}
						return n > 0
					}

					l, err := x.c.TryAcquire(x.callCtx, "job", time.Minute)
					if err != nil {
						t.Fatal(err)
					}
					lost := x.answers.Arm(pgtest.ReleaseCall)
					err = l.Release(x.callCtx)
					pgtest.MustHaveLost(t, lost, "Release")
					if errors.Is(err, ErrLost) {
						t.Errorf("Release whose answer was lost = %v; the lease was not lost", err)
					}
					t.Logf("Release = %v", err)
					pgtest.WaitFor(t, testTimeout, "the grant to end", func() bool { return !live() })

					err = x.c.Run(x.callCtx, "run", time.Minute, func(context.Context, *Lease) error {
						lost = x.answers.Arm(pgtest.ReleaseCall)
						return nil
					})
					pgtest.MustHaveLost(t, lost, "Run's release")
					if err != nil {
						t.Errorf("Run whose fn returned nil, its release's answer lost = %v; want nil", err)
					}
					pgtest.WaitFor(t, testTimeout, "the run's grant to end", func() bool { return !live() })
				})
			}
		}
	}
}

// A lostAnswerCase is the set-up of one subtest above: a fresh database,
// an admin pool on it, a client over driver in mode whose connections are
// dialled through answers, the test's context, and the one the calls run
// with: the test's if ends, else one that cannot end.
type lostAnswerCase struct {
	admin        *pgxpool.Pool
	ctx, callCtx context.Context
	c            *Client
	answers      *pgtest.LostAnswers
}

func newLostAnswerCase(t *testing.T, driver string, mode pgx.QueryExecMode, ends bool) lostAnswerCase {
	t.Helper()
	url := pgtest.URL(t)
	x := lostAnswerCase{admin: pgtest.PoolFor(t, url), ctx: testContext(t), callCtx: context.Background(), answers: new(pgtest.LostAnswers)}
	if ends {
		x.callCtx = x.ctx
	}
	x.c = clientOver(t, driver, url, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.ConnConfig.DialFunc = x.answers.Dial
	})
	return x
}
