package leases

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// effectsTable creates a protected table of periods' effects, without a
// unique key on the period: only the lease and the record prevent
// duplicates.
func effectsTable(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (id bigserial PRIMARY KEY, period text NOT NULL, by text NOT NULL, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if err := fencing.Protect(ctx, pool, "effects"); err != nil {
		t.Fatal(err)
	}
}

// effectCounts returns how many effects each period has.
func effectCounts(t *testing.T, pool *pgxpool.Pool) map[string]int {
	t.Helper()
	rows, err := pool.Query(testContext(t), `SELECT period, count(*)::int FROM effects GROUP BY period`)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for rows.Next() {
		var p string
		var c int
		if err := rows.Scan(&p, &c); err != nil {
			t.Fatal(err)
		}
		n[p] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// Three clients run the same periods at once with OnceTx: each period's
// effect is written once, and exactly one call per period reports ran.
func TestOnceTxExactlyOncePerPeriod(t *testing.T) {
	t.Parallel()
	const periods = 6
	cs, pools := clients(t, 3)
	effectsTable(t, pools[0])
	ctx := testContext(t)
	var ran [periods]atomic.Int32
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := range periods {
				period := fmt.Sprintf("2026-12-%02d", p+1)
				did, err := c.OnceTx(ctx, "billing/nightly", period, 5*time.Second, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
					_, err := tx.Exec(ctx, `INSERT INTO effects (period, by) VALUES ($1, $2)`, period, fmt.Sprint(i))
					return err
				})
				if err != nil {
					t.Errorf("client %d period %s: %v", i, period, err)
					return
				}
				if did {
					ran[p].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	counts := effectCounts(t, pools[0])
	for p := range periods {
		period := fmt.Sprintf("2026-12-%02d", p+1)
		if counts[period] != 1 || ran[p].Load() != 1 {
			t.Errorf("period %s: %d effects, %d calls ran it; want 1 and 1", period, counts[period], ran[p].Load())
		}
		rec, done, err := cs[0].OnceDone(ctx, "billing/nightly", period)
		if err != nil || !done || rec.Fence <= 0 {
			t.Errorf("OnceDone(%s) = %+v, %v, %v", period, rec, done, err)
		}
	}
}

// OnceTx's transaction holds the lease's fence lock, not a lock on the
// lease row (READ COMMITTED, the default): the keepalive renews the lease
// while fn runs, so fn may outlast the TTL. fn waits, inside the open
// transaction, until the lease has been renewed more than twice its TTL
// after the grant, and then commits. The TTL leaves a renewal about 1.7 s
// to succeed (a renewal every TTL/3, the local deadline at TTL − 10 %): at
// 1 s, a busy CI machine's stalls lost the lease about one run in five.
func TestOnceTxOutlivesTTL(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second
	cs, pools := clients(t, 1)
	effectsTable(t, pools[0])
	ctx := testContext(t)
	watch := pools[0] // another of its connections than the transaction's
	did, err := cs[0].OnceTx(ctx, "long", "p1", ttl, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (period, by) VALUES ('p1', 'long')`); err != nil {
			return err
		}
		// Bound: 3 TTLs of renewals plus a loaded machine's slack.
		renewed := pgtest.Poll(30*time.Second, func() bool {
			var ok bool
			err := watch.QueryRow(ctx, `SELECT renewed_at > acquired_at + 2 * $1 * interval '1 microsecond'
				  FROM pgfence.leases WHERE name = 'long' AND fence = $2`, ttl.Microseconds(), l.Fence()).Scan(&ok)
			return err == nil && ok
		})
		if !renewed {
			return errors.New("the lease was not renewed past twice its TTL while the transaction was open")
		}
		return l.Err()
	})
	if err != nil || !did {
		t.Fatalf("OnceTx whose fn outlasts the TTL = %v, %v; want true, nil", did, err)
	}
	if n := effectCounts(t, pools[0])["p1"]; n != 1 {
		t.Errorf("effects of p1 = %d, want 1", n)
	}
}

// A failure before the record leaves the period to the next caller, with
// OnceTx (the effects roll back too) and with Once.
func TestOnceFailureLeavesPeriodUndone(t *testing.T) {
	t.Parallel()
	cs, pools := clients(t, 2)
	effectsTable(t, pools[0])
	ctx := testContext(t)
	boom := errors.New("boom")
	did, err := cs[0].OnceTx(ctx, "job", "p1", 5*time.Second, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
		if _, err := tx.Exec(ctx, `INSERT INTO effects (period, by) VALUES ('p1', 'a')`); err != nil {
			return err
		}
		return boom
	})
	if did || !errors.Is(err, boom) {
		t.Fatalf("failing OnceTx = %v, %v; want false, boom", did, err)
	}
	did, err = cs[1].OnceTx(ctx, "job", "p1", 5*time.Second, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
		_, err := tx.Exec(ctx, `INSERT INTO effects (period, by) VALUES ('p1', 'b')`)
		return err
	})
	if !did || err != nil {
		t.Fatalf("next OnceTx = %v, %v; want true, nil", did, err)
	}
	if n := effectCounts(t, pools[0])["p1"]; n != 1 {
		t.Errorf("p1 has %d effects, want 1 (the failed one rolled back)", n)
	}

	calls := 0
	fn := func(ctx context.Context, l *Lease) error {
		calls++
		if calls == 1 {
			return boom
		}
		return nil
	}
	if did, err := cs[0].Once(ctx, "job", "p2", 5*time.Second, fn); did || !errors.Is(err, boom) {
		t.Fatalf("failing Once = %v, %v; want false, boom", did, err)
	}
	if did, err := cs[1].Once(ctx, "job", "p2", 5*time.Second, fn); !did || err != nil {
		t.Fatalf("next Once = %v, %v; want true, nil", did, err)
	}
	if did, err := cs[0].Once(ctx, "job", "p2", 5*time.Second, fn); did || err != nil || calls != 2 {
		t.Fatalf("Once of a done period = %v, %v after %d calls; want false, nil after 2", did, err, calls)
	}
}

// A holder whose lease is lost while fn runs records nothing; Once takes
// the lease again and runs the period again.
func TestOnceLostLeaseRunsAgain(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	freeze(c)
	ctx := testContext(t)
	var fences []int64
	did, err := c.Once(ctx, "job", "p1", time.Second, func(ctx context.Context, l *Lease) error {
		fences = append(fences, l.Fence())
		if len(fences) == 1 {
			<-ctx.Done() // not renewed: lost at the local deadline
			return ctx.Err()
		}
		return nil
	})
	if !did || err != nil || len(fences) != 2 || fences[1] <= fences[0] {
		t.Fatalf("Once = %v, %v with fences %v; want true, nil after two grants", did, err, fences)
	}
}

// A stalled former holder cannot record a period: its token is stale. The
// current holder records it once; a second record is refused; a token of
// another lease cannot record.
func TestMarkDoneFenced(t *testing.T) {
	t.Parallel()
	cs, pools := clients(t, 2)
	a, b := cs[0], cs[1]
	pool := pools[0]
	ctx := testContext(t)
	old, err := a.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ForceRelease(ctx, "job"); err != nil {
		t.Fatal(err)
	}
	cur, err := b.Acquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	mark := func(tok fencing.Token, name string) (bool, error) {
		var recorded bool
		err := fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
			var err error
			recorded, err = MarkDone(ctx, tx, name, "p1")
			return err
		})
		return recorded, err
	}
	if ok, err := mark(old.Token(), "job"); ok || !fencing.IsStale(err) {
		t.Errorf("MarkDone by the former holder = %v, %v; want stale", ok, err)
	}
	other, err := a.TryAcquire(ctx, "other", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := mark(other.Token(), "job"); ok || !fencing.IsNoToken(err) {
		t.Errorf("MarkDone of job with a token of another lease = %v, %v; want no token", ok, err)
	}
	if ok, err := mark(cur.Token(), "job"); !ok || err != nil {
		t.Errorf("MarkDone by the holder = %v, %v; want true", ok, err)
	}
	if ok, err := mark(cur.Token(), "job"); ok || err != nil {
		t.Errorf("second MarkDone = %v, %v; want false, nil", ok, err)
	}
	rec, done, err := a.OnceDone(ctx, "job", "p1")
	if err != nil || !done || rec.Fence != cur.Fence() {
		t.Errorf("OnceDone = %+v, %v, %v; want fence %d", rec, done, err, cur.Fence())
	}
	if _, err := MarkDone(ctx, nil, "job", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("MarkDone with an empty period = %v, want ErrInvalid", err)
	}
}

// A minimum hold keeps the grant after Release until acquired_at + d by
// the database clock; a release after that time ends it at once.
func TestHoldAtLeast(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	l, err := a.TryAcquire(ctx, "tick", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{-time.Second, 25 * time.Hour} {
		if err := l.HoldAtLeast(d); !errors.Is(err, ErrInvalid) {
			t.Errorf("HoldAtLeast(%s) = %v, want ErrInvalid", d, err)
		}
	}
	if err := l.HoldAtLeast(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if !errors.Is(l.Err(), ErrReleased) {
		t.Errorf("after Release: Err = %v, want ErrReleased", l.Err())
	}
	info, err := b.Get(ctx, "tick")
	if err != nil || info.Fence != l.Fence() || !info.ExpiresAt.Equal(l.acquiredAt.Add(30*time.Second)) {
		t.Fatalf("Get after Release = %+v, %v; want fence %d until acquired_at+30s (%s)", info, err, l.Fence(), l.acquiredAt.Add(30*time.Second))
	}
	if _, err := b.TryAcquire(ctx, "tick", time.Minute); !errors.Is(err, ErrHeld) {
		t.Errorf("TryAcquire within the minimum hold = %v, want ErrHeld", err)
	}

	// A hold already past: the release takes effect at once.
	l2, err := a.TryAcquire(ctx, "tock", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.HoldAtLeast(time.Microsecond); err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "tock", time.Minute); err != nil {
		t.Errorf("TryAcquire after a release past the minimum hold = %v, want granted", err)
	}
}

// Once with AtLeast: a fast period still keeps the lease for the minimum
// hold. Bad input writes nothing.
func TestOnceAtLeastAndInvalid(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	ctx := testContext(t)
	did, err := cs[0].Once(ctx, "cron", "00:00", 5*time.Second, func(context.Context, *Lease) error { return nil }, AtLeast(time.Minute))
	if !did || err != nil {
		t.Fatalf("Once = %v, %v", did, err)
	}
	if _, err := cs[1].TryAcquire(ctx, "cron", 5*time.Second); !errors.Is(err, ErrHeld) {
		t.Errorf("TryAcquire right after a fast period with AtLeast(1m) = %v, want ErrHeld", err)
	}
	noop := func(context.Context, *Lease) error { return nil }
	for _, tc := range []struct {
		name, period string
		ttl          time.Duration
		opts         []OnceOption
	}{
		{"", "p", time.Second, nil},
		{"j", "", time.Second, nil},
		{"j", "p\x00", time.Second, nil},
		{"j", "p", time.Millisecond, nil},
		{"j", "p", time.Second, []OnceOption{AtLeast(-1)}},
		{"j", "p", time.Second, []OnceOption{nil}},
	} {
		if _, err := cs[0].Once(ctx, tc.name, tc.period, tc.ttl, noop, tc.opts...); !errors.Is(err, ErrInvalid) {
			t.Errorf("Once(%q, %q, %s) = %v, want ErrInvalid", tc.name, tc.period, tc.ttl, err)
		}
	}
	if _, err := cs[0].OnceTx(ctx, "j", "p", time.Second, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("OnceTx with nil fn = %v, want ErrInvalid", err)
	}
}

// heldRenewals is a pgx tracer that holds every batch renewal at its start
// until proceed is closed, once armed is closed; started gets one value
// per renewal it holds, and ended one per renewal that returned.
type heldRenewals struct {
	armed, proceed chan struct{}
	started, ended chan struct{}
}

func (h *heldRenewals) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL != sqlRenewBatch {
		return ctx
	}
	select {
	case <-h.armed:
	default:
		return ctx
	}
	h.started <- struct{}{}
	<-h.proceed
	return context.WithValue(ctx, heldRenewals{}, true)
}

func (h *heldRenewals) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(heldRenewals{}) != nil {
		h.ended <- struct{}{}
	}
}

// TestHoldAtLeastBeatsARenewalInFlight (scenario: the keepalive's renewal
// of a lease is on its way — slow to get a connection, slow on the
// network — when Release with a minimum hold commits). The renewal must
// not land after the release: it would set expires_at to its own now +
// TTL, and another replica could take the lease before the minimum hold.
func TestHoldAtLeastBeatsARenewalInFlight(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	h := &heldRenewals{armed: make(chan struct{}), proceed: make(chan struct{}),
		started: make(chan struct{}, 8), ended: make(chan struct{}, 8)}
	pool := pgtest.PoolFor(t, url, func(c *pgxpool.Config) { c.ConnConfig.Tracer = h })
	c := newClient(t, pool)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "tick", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const hold = 20 * time.Second
	if err := l.HoldAtLeast(hold); err != nil {
		t.Fatal(err)
	}
	close(h.armed)
	select {
	case <-h.started: // the keepalive's renewal, TTL/3 after the grant, is on its way
	case <-ctx.Done():
		t.Fatal("no renewal")
	}
	released := make(chan error, 1)
	go func() { released <- l.Release(ctx) }()
	// Let the release commit first if it does not wait for the renewal:
	// polled, for a second at most (it commits within a round trip).
	pgtest.Poll(time.Second, func() bool {
		var held bool
		err := pool.QueryRow(ctx, `SELECT expires_at - acquired_at >= $1 FROM pgfence.leases WHERE name = 'tick'`, hold).Scan(&held)
		return err == nil && held
	})
	close(h.proceed)
	<-h.ended
	if err := <-released; err != nil {
		t.Fatalf("Release: %v", err)
	}
	var kept time.Duration
	if err := pool.QueryRow(ctx, `SELECT expires_at - acquired_at FROM pgfence.leases WHERE name = 'tick'`).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if kept != hold {
		t.Fatalf("the grant ends %v after acquired_at, want the minimum hold, %v", kept, hold)
	}
}

// A hand-over requested while Once's fn finishes (scenario: a rolling
// deploy reaches the replica running the nightly job). fn's context ends
// with ErrHandover, but the lease is still held until released: a fn that
// completes the period anyway must see it recorded, or the next holder
// runs it again — a second run of effects Once exists to prevent. The
// record's fenced transaction, not fn's context, is what refuses a holder
// that lost the lease.
func TestOnceRecordsAfterHandoverRequest(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, op := cs[0], cs[1]
	ctx := testContext(t)
	waitListening(t, a) // the holder hears the request at once
	runs := 0
	fn := func(fctx context.Context, l *Lease) error {
		runs++
		if _, err := op.RequestHandover(ctx, "nightly", time.Second); !errors.Is(err, ErrHandoverTimeout) {
			t.Errorf("RequestHandover while fn runs: %v, want ErrHandoverTimeout", err)
		}
		<-fctx.Done()
		if !errors.Is(context.Cause(fctx), ErrHandover) {
			t.Errorf("fn's cause: %v, want ErrHandover", context.Cause(fctx))
		}
		return nil // the period's work was complete
	}
	did, err := a.Once(ctx, "nightly", "2026-12-04", time.Minute, fn)
	if !did || err != nil {
		t.Errorf("Once whose fn completed after a hand-over request = %v, %v; want true, nil", did, err)
	}
	if _, done, err := op.OnceDone(ctx, "nightly", "2026-12-04"); !done || err != nil {
		t.Errorf("OnceDone after it: %v, %v; want recorded", done, err)
	}
	if did, err := op.Once(ctx, "nightly", "2026-12-04", time.Minute, func(context.Context, *Lease) error {
		runs++
		return nil
	}); did || err != nil || runs != 1 {
		t.Errorf("next replica's Once = %v, %v after %d runs; want false, nil after 1", did, err, runs)
	}
}
