package leases

import (
	"context"
	"fmt"
	"testing"

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
			url := pgtest.URL(t)
			admin := pgtest.PoolFor(t, url)
			ctx := testContext(t)
			var answers pgtest.LostAnswers
			c := clientOver(t, v.driver, url, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.DefaultQueryExecMode = v.mode
				cfg.ConnConfig.DialFunc = answers.Dial
			})
			callCtx := context.Background()
			if v.ends {
				callCtx = ctx
			}

			lost := answers.Arm("pgfence.try_acquire")
			l, err := v.take.take(callCtx, c)
			select {
			case <-lost:
			default:
				t.Fatalf("%s = %v, %v: the grant's answer was not lost (the premise of this test)", v.take.name, l, err)
			}
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
