package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

func TestDriversLeases(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, 2*time.Minute)
		const ttl = 2 * time.Second
		c1 := mustClient(t, d.open(t, u, "c1"), "one", leases.WithPollInterval(200*time.Millisecond))
		c2 := mustClient(t, d.open(t, u, "c2"), "two", leases.WithPollInterval(200*time.Millisecond))

		l1, err := c1.TryAcquire(ctx, "res", ttl)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		_, err = c2.TryAcquire(ctx, "res", ttl)
		var held *leases.HeldError
		if !errors.As(err, &held) || !errors.Is(err, leases.ErrHeld) || held.Holder.Owner != l1.Owner() {
			t.Fatalf("second TryAcquire: got %v, want a *HeldError naming %s", err, l1.Owner())
		}

		// Renewals (the keepalive's batch statement) keep it past its TTL.
		select {
		case <-l1.Done():
			t.Fatalf("lease lost while renewed: %v", l1.Err())
		case <-time.After(2*ttl + 500*time.Millisecond):
		}
		row, ok, err := readLease(ctx, admin, "res")
		if err != nil || !ok || !row.live() || row.Fence != l1.Fence() {
			t.Fatalf("lease row after 2 TTLs: %+v %v %v; want fence %d, live", row, ok, err, l1.Fence())
		}
		if infos, err := c2.List(ctx); err != nil || len(infos) != 1 || infos[0].Owner != l1.Owner() {
			t.Fatalf("List: %+v, %v", infos, err)
		}

		// Acquire waits and gets the lease once it is released.
		type result struct {
			l   *leases.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := c2.Acquire(ctx, "res", ttl)
			got <- result{l, err}
		}()
		select {
		case r := <-got:
			t.Fatalf("Acquire returned while the lease was held: %v, %v", r.l, r.err)
		default:
		}
		if err := l1.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		var l2 *leases.Lease
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("Acquire: %v", r.err)
			}
			l2 = r.l
		case <-time.After(15 * time.Second): // a poll interval away, over database/sql
			t.Fatal("Acquire did not get the released lease")
		}
		if l2.Fence() <= l1.Fence() {
			t.Fatalf("new fence %d not above %d", l2.Fence(), l1.Fence())
		}

		// ForceRelease: the holder loses it at its next renewal.
		if err := c1.ForceRelease(ctx, "res"); err != nil {
			t.Fatalf("ForceRelease: %v", err)
		}
		select {
		case <-l2.Done():
		case <-time.After(15 * time.Second): // next renewal within TTL/3
			t.Fatal("holder did not lose a force-released lease")
		}
		if !errors.Is(l2.Err(), leases.ErrLost) {
			t.Fatalf("Err after ForceRelease: %v, want ErrLost", l2.Err())
		}
		if _, err := c1.Get(ctx, "res"); !errors.Is(err, leases.ErrNotHeld) {
			t.Fatalf("Get after ForceRelease: %v, want ErrNotHeld", err)
		}

		// Close ends every held grant in one statement (arrays of names).
		other, err := c2.TryAcquire(ctx, "other", ttl)
		if err != nil {
			t.Fatalf("TryAcquire other: %v", err)
		}
		if err := c2.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if row, ok, err := readLease(ctx, admin, "other"); err != nil || !ok || row.live() {
			t.Fatalf("lease %q after Close: %+v %v %v; want ended", other.Name(), row, ok, err)
		}
	})
}

func TestDriversFencing(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		h := d.open(t, u, "app")
		c := mustClient(t, h, "writer")
		protectedTable(t, admin, "accounts", "id int PRIMARY KEY, balance int NOT NULL")

		l1, err := c.TryAcquire(ctx, "acct", 2*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		if err := h.fenced(ctx, l1.Token(), `INSERT INTO accounts (id, balance) VALUES ($1, $2)`, 1, 100); err != nil {
			t.Fatalf("fenced insert with the current token: %v", err)
		}
		stale := l1.Token()
		if err := l1.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		l2, err := c.TryAcquire(ctx, "acct", 2*time.Second)
		if err != nil {
			t.Fatalf("TryAcquire again: %v", err)
		}
		if err := h.fenced(ctx, l2.Token(), `UPDATE accounts SET balance = $1 WHERE id = $2`, 200, 1); err != nil {
			t.Fatalf("fenced update with the new token: %v", err)
		}
		err = h.fenced(ctx, stale, `UPDATE accounts SET balance = $1 WHERE id = $2`, 300, 1)
		var se *fencing.StaleError
		if !errors.Is(err, fencing.ErrStale) || !fencing.IsStale(err) || !errors.As(err, &se) ||
			se.PgError == nil || se.PgError.Code != fencing.SQLStateStale || se.Token != stale {
			t.Fatalf("fenced update with the stale token: %v, want a *StaleError (PF001) for %v", err, stale)
		}
		var balance int
		if err := admin.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = 1`).Scan(&balance); err != nil || balance != 200 {
			t.Fatalf("balance after the rejected write: %d (%v), want 200", balance, err)
		}
		if err := h.fenced(ctx, fencing.Token{}, `SELECT 1`); !errors.Is(err, fencing.ErrInvalid) {
			t.Fatalf("fenced with the zero token: %v, want ErrInvalid", err)
		}
	})
}

// TestDriversCancelledGrant (scenario: the caller of a grant gives up
// while the grant waits for an expired holder's open fenced transaction,
// over each driver). The call returns ctx's error promptly, and the grant
// never happens: when the holder commits, no backend of the caller is
// still queued to take the lease.
func TestDriversCancelledGrant(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		holder := ghostInFencedWrite(t, ctx, u, admin)
		waiting := takerWaiting(ctx, admin)
		done, cancel := tryInBackground(ctx, mustClient(t, d.open(t, u, "taker"), "taker"))
		defer cancel()
		mustWait(t, 30*time.Second, "the grant to wait for the fence lock", waiting)
		cancel()
		start := time.Now()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("TryAcquire = %v, want an error matching context.Canceled", err)
			}
			t.Logf("TryAcquire returned %v after %v", err, time.Since(start).Round(time.Millisecond))
		case <-time.After(30 * time.Second): // a cancel request and a round trip, on a loaded machine
			t.Fatal("TryAcquire did not return after its context ended")
		}
		mustWait(t, 30*time.Second, "the grant's wait to end on the server", func() (bool, error) {
			ok, err := waiting()
			return !ok, err
		})
		if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
			t.Fatal(err)
		}
		row, _, err := readLease(ctx, admin, "res")
		if err != nil || row.Owner != "ghost" || row.live() {
			t.Fatalf("lease after the holder committed: %+v, %v; want the ghost's expired grant", row, err)
		}
	})
}

// TestDriversCancelledGrantSilentNetwork (scenario: as
// TestDriversCancelledGrant, but the network between the caller and the
// server goes silent before the caller gives up, so neither a cancel
// request nor anything else gets through). The call still returns within
// the release timeout (plus a second over lib/pq, which does not end a
// statement when its context ends), with ctx's error saying the grant is
// in doubt; the connection is given up once the driver returns.
func TestDriversCancelledGrantSilentNetwork(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		holder := ghostInFencedWrite(t, ctx, u, admin)
		defer func() { _, _ = holder.Exec(ctx, `ROLLBACK`) }()
		px := proxyTo(t, admin)
		h := d.open(t, px.URL(t, u), "taker")
		const release = 500 * time.Millisecond
		done, cancel := tryInBackground(ctx, mustClient(t, h, "taker", leases.WithReleaseTimeout(release)))
		defer cancel()
		mustWait(t, 30*time.Second, "the grant to wait for the fence lock", takerWaiting(ctx, admin))
		px.Blackhole()
		cancel()
		start := time.Now()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "in doubt") {
				t.Errorf("TryAcquire = %v, want context.Canceled, in doubt", err)
			}
			t.Logf("TryAcquire returned %v after %v", err, time.Since(start).Round(time.Millisecond))
		case <-time.After(release + 10*time.Second): // a second more over lib/pq, and a loaded machine
			t.Fatalf("TryAcquire had not returned %v after its context ended behind a silent network", time.Since(start))
		}
		px.Close()
		mustWait(t, 30*time.Second, "the taker's connections to be given up", func() (bool, error) { return h.inUse() == 0, nil })
	})
}

// TestDriversLeaseSilentNetwork (scenario: the network between a lease's
// holder and the server goes silent — packets dropped, nothing closed).
// Over every driver the Lease's Context ends by its local deadline,
// before the server's expiry, and Release and Close return within their
// bounds: the keepalive's renewals, which no driver may end in time (lib/pq
// does not end a statement when its context ends), do not hold them up.
func TestDriversLeaseSilentNetwork(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, time.Minute)
		px := proxyTo(t, admin)
		h := d.open(t, px.URL(t, u), "holder")
		const ttl, release = 2 * time.Second, 500 * time.Millisecond
		c, err := h.client(leases.WithOwner("holder"), leases.WithReleaseTimeout(release))
		if err != nil {
			t.Fatal(err)
		}
		l, err := c.TryAcquire(ctx, "res", ttl)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		px.Blackhole()
		start := time.Now()
		select {
		case <-l.Done():
			t.Logf("the Lease's Context ended %v after the network went silent", time.Since(start).Round(time.Millisecond))
		case <-time.After(ttl + 10*time.Second):
			t.Fatalf("the Lease's Context had not ended %v after the network went silent (TTL %v)", time.Since(start), ttl)
		}
		row, _, err := readLease(ctx, admin, "res")
		if err != nil {
			t.Fatal(err)
		}
		if !row.live() {
			t.Errorf("the Lease's Context ended after the server's expiry (%v)", row.ExpiresAt)
		}
		rstart := time.Now()
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_ = l.Release(rctx) // it fails: the network is silent
		if took := time.Since(rstart); took > 10*time.Second {
			t.Errorf("Release(ctx with a 1s timeout) took %v", took)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case <-closed:
		case <-time.After(release + 10*time.Second):
			px.Close()
			<-closed
			t.Fatalf("Close had not returned %v after it was called behind a silent network", release+10*time.Second)
		}
		px.Close()
		mustWait(t, 30*time.Second, "the holder's connections to be given up", func() (bool, error) { return h.inUse() == 0, nil })
	})
}

// ghostInFencedWrite grants lease "res" for 1s to an owner nobody runs
// ("ghost"), opens, on a session of application "holder", a fenced
// transaction under that grant that writes to a protected table and stays
// open, and waits for the grant to expire: a takeover now waits for the
// transaction (the fence lock). The session is released when t ends; the
// caller commits or rolls back.
func ghostInFencedWrite(t *testing.T, ctx context.Context, u string, admin *pgxpool.Pool) *pgxpool.Conn {
	t.Helper()
	protectedTable(t, admin, "work", "id int PRIMARY KEY")
	var fence int64
	if err := admin.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('res', 'ghost', 1000000, NULL)`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	holder, err := newPool(t, u, "holder").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(holder.Release)
	for _, q := range []string{`BEGIN`, `SELECT pgfence.declare_token('res', ` + strconv.FormatInt(fence, 10) + `)`, `INSERT INTO work VALUES (1)`} {
		if _, err := holder.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustWait(t, 30*time.Second, "the ghost's grant to expire", func() (bool, error) {
		row, _, err := readLease(ctx, admin, "res")
		return err == nil && !row.live(), err
	})
	return holder
}

// takerWaiting reports whether a session of application "taker" in
// admin's database waits for an advisory lock (the fence lock).
func takerWaiting(ctx context.Context, admin *pgxpool.Pool) func() (bool, error) {
	return func() (bool, error) {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND application_name = 'taker' AND state = 'active' AND wait_event = 'advisory'`).Scan(&n)
		return n > 0, err
	}
}

// tryInBackground runs c.TryAcquire of "res" in a goroutine under a
// context of its own, ended by the returned cancel; done receives its
// error (a grant is an error here).
func tryInBackground(ctx context.Context, c *leases.Client) (done <-chan error, cancel context.CancelFunc) {
	gctx, cancel := context.WithCancel(ctx)
	ch := make(chan error, 1)
	go func() {
		l, err := c.TryAcquire(gctx, "res", time.Minute)
		if err == nil {
			err = fmt.Errorf("granted %v", l)
		}
		ch <- err
	}()
	return ch, cancel
}
