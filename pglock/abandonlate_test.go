package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A wait abandoned while its statement is still on the way to the server
// leaves no backend waiting either, and Lock returns soon after the
// statement arrives. The cancel request reaches the backend first, while
// it is idle, and the server ignores it; pglock's fallback, which cancels
// the backend from another connection only while it waits for the key,
// found it not waiting yet. Before the fix it then waited for the whole
// unlock timeout (15s here) before giving the statement up, and left the
// waiting backend to whatever closing the connection would do.
func TestAbandonedWaitStatementLate(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "database/sql"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			const late = time.Second
			url := pgtest.URL(t)
			observer := newPool(t, url, 2)
			var wire pgtest.LateWrites
			pool := pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) {
				cfg.MaxConns = 4
				cfg.ConnConfig.DialFunc = wire.Dial
			})
			opt := WithUnlockTimeout(15 * time.Second)
			l := newLocker(t, pool, opt)
			if driver == "database/sql" {
				l = dbLockerWith(t, pool, opt) // the same dial
			}
			ctx := testContext(t)
			holder, err := l.Lock(ctx, "late")
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Unlock(ctx)

			wctx, cancel := context.WithCancel(ctx)
			defer cancel()
			seen := wire.CancelWhenSent("pg_advisory_lock(", late, cancel)
			start := time.Now()
			lk, err := l.Lock(wctx, "late")
			took := time.Since(start)
			if !<-seen {
				t.Fatal("the blocking acquire was never seen on the wire (is the connection encrypted?)")
			}
			if err == nil {
				lk.Unlock(ctx)
				t.Fatal("granted while held")
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("abandoned Lock = %v, want context.Canceled", err)
			}
			// The statement arrives after late; cancelling it then takes
			// a round trip or two. 4s more is for a loaded machine, and
			// far from the 15s unlock timeout.
			if took > late+4*time.Second {
				t.Errorf("Lock returned %v after its call, its statement %v late; want soon after the statement arrived", took.Round(time.Millisecond), late)
			}
			t.Logf("Lock returned %v after its call, its statement %v late", took.Round(time.Millisecond), late)
			pgtest.WaitFor(t, time.Second, "no backend waiting for the lock", func() bool { return waiters(t, observer) == 0 })
		})
	}
}
