package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

type term struct {
	candidate int
	fence     int64
}

// Three candidates elect a leader: at every moment at most one runs fn;
// force-releasing the lease and killing the leader's connections hand
// leadership on (or let the leader recover), and cancelling ends it all.
func TestLeadAtMostOneLeader(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	url := pgtest.URL(t)
	admin := pgtest.PoolFor(t, url)
	adminClient := newClient(t, admin)
	ctx := testContext(t)
	lctx, stop := context.WithCancel(ctx)
	defer stop()

	var leading atomic.Int32 // fn running
	// The contexts of every fn that ever led: when one starts, every
	// other's must have ended already. Checked on the contexts themselves,
	// not by counting fns, which see their contexts end only when the
	// scheduler runs them — on a loaded machine, possibly after the margin
	// has passed and the next leader has begun.
	var leaderCtxs []context.Context
	var leaderMu sync.Mutex
	// Force-release is break-glass: PostgreSQL grants the lease anew at
	// once, while the old leader learns only when its client checks (on
	// the release notification, else at its next renewal). In that window
	// fencing, not the lease, keeps the old leader harmless; the test
	// bounds the window instead of counting leaders.
	var forcing atomic.Bool
	terms := make(chan term, 100)
	var mu sync.Mutex
	ended := map[int64]error{} // fence -> cause of fn's context
	var wg sync.WaitGroup
	for i := range 3 {
		pool := pgtest.PoolFor(t, fmt.Sprintf("%s&application_name=cand%d", url, i))
		c := newClient(t, pool, WithOwner(fmt.Sprintf("cand%d", i)))
		wg.Go(func() {
			err := c.Lead(lctx, "leader", ttl, func(ctx context.Context, l *Lease) error {
				leading.Add(1)
				leaderMu.Lock()
				for _, other := range leaderCtxs {
					if other.Err() == nil && !forcing.Load() {
						t.Errorf("candidate %d leads (fence %d) while an earlier leader's context is still open", i, l.Fence())
					}
				}
				leaderCtxs = append(leaderCtxs, ctx)
				leaderMu.Unlock()
				terms <- term{candidate: i, fence: l.Fence()}
				<-ctx.Done()
				leading.Add(-1)
				mu.Lock()
				ended[l.Fence()] = context.Cause(ctx)
				mu.Unlock()
				return ctx.Err()
			})
			if err != nil {
				t.Errorf("Lead = %v, want nil after cancellation", err)
			}
		})
	}
	nextTerm := func(after term) term {
		t.Helper()
		for {
			select {
			case tm := <-terms:
				if tm.fence > after.fence {
					return tm
				}
				t.Errorf("term fence %d not above %d", tm.fence, after.fence)
			case <-ctx.Done():
				t.Fatal("no new leader")
			}
		}
	}
	first := nextTerm(term{})
	t.Logf("leader: candidate %d, fence %d", first.candidate, first.fence)

	// Break-glass: the leader loses at its next renewal; someone leads
	// again with a higher fence.
	forcing.Store(true)
	forced := time.Now()
	if err := adminClient.ForceRelease(ctx, "leader"); err != nil {
		t.Fatal(err)
	}
	second := nextTerm(first)
	t.Logf("after force-release: candidate %d, fence %d", second.candidate, second.fence)
	pgtest.WaitFor(t, testTimeout, "the force-released leader's fn to end", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return ended[first.fence] != nil
	})
	learned := time.Since(forced)
	forcing.Store(false)
	t.Logf("the force-released leader stopped after %s", learned)
	// It must learn by its next renewal (TTL/3) at the latest; generous
	// bound for CI load. Typically it learns from the notification, in ms.
	if learned > ttl {
		t.Errorf("force-released leader ran on for %s (TTL %s)", learned, ttl)
	}
	mu.Lock()
	if cause := ended[first.fence]; !errors.Is(cause, ErrLost) {
		t.Errorf("old leader's context ended with %v, want ErrLost", cause)
	}
	mu.Unlock()

	// Kill every backend of the leader's pool: it either renews on a fresh
	// connection and stays leader, or loses and another takes over; either
	// way somebody leads again and never two at once.
	killed, err := terminate(ctx, admin, fmt.Sprintf("cand%d", second.candidate))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("terminated %d backends of candidate %d", killed, second.candidate)
	pgtest.WaitFor(t, testTimeout, "a new leader after the terminated backends", func() bool {
		info, err := adminClient.Get(ctx, "leader")
		return err == nil && leading.Load() == 1 && info.Fence >= second.fence
	})
	// Two TTLs of the leader under observation: at most one, and the
	// lease never lapses for long.
	timer := time.NewTimer(2 * ttl)
	<-timer.C

	stop()
	wg.Wait()
	if n := leading.Load(); n != 0 {
		t.Errorf("%d fn still running after Lead returned", n)
	}
	if _, err := adminClient.Get(ctx, "leader"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after Lead returned: Get = %v, want ErrNotHeld (released)", err)
	}
}

// terminate kills every backend with the given application_name.
func terminate(ctx context.Context, admin *pgxpool.Pool, app string) (int, error) {
	var n int
	err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = $1`, app).Scan(&n)
	return n, err
}

func TestLeadReturnsFnResultWhileLeader(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	ctx := testContext(t)
	boom := errors.New("boom")
	// 10s: a grant of a second can run out on a loaded machine before
	// the release that follows fn, which then reports it lost.
	if err := c.Lead(ctx, "l", 10*time.Second, func(context.Context, *Lease) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Lead = %v, want fn's error", err)
	}
	if err := c.Lead(ctx, "l", 10*time.Second, func(context.Context, *Lease) error { return nil }); err != nil {
		t.Errorf("Lead = %v, want nil", err)
	}
	if _, err := c.Get(ctx, "l"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Get after Lead = %v, want ErrNotHeld", err)
	}
}

// Lead in a database whose encoding is not UTF-8 (LATIN1: the migrations
// apply there), under a name or with data that the encoding cannot hold:
// every grant fails the same way (SQLSTATE 22P05, a data exception), so
// Lead must return the error, as for bad input, not campaign until its
// context ends.
func TestLeadReturnsUntranslatableInput(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptyURLEncoded(t, "LATIN1")
	if err := migrations.Up(context.Background(), u); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolFor(t, u, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["client_encoding"] = "UTF8" })
	c := newClient(t, pool)
	fn := func(context.Context, *Lease) error { return nil }
	for _, tc := range []struct {
		name string
		opts []AcquireOption
	}{
		{"リーダー", nil},
		{"leader", []AcquireOption{WithData(json.RawMessage(`"日本"`))}},
	} {
		// 5s: far above one failed grant, far below the test's bound.
		ctx, cancel := context.WithTimeout(testContext(t), 5*time.Second)
		err := c.Lead(ctx, tc.name, time.Minute, fn, tc.opts...)
		stopped := ctx.Err() == nil
		cancel()
		if err == nil || !stopped {
			t.Errorf("Lead %q in a LATIN1 database = %v (returned before its context ended: %v), want the grant's error at once", tc.name, err, stopped)
		}
	}
	// A name the encoding holds works.
	if err := c.Lead(testContext(t), "naïve", time.Minute, fn); err != nil {
		t.Errorf("Lead of a name LATIN1 holds: %v", err)
	}
}
