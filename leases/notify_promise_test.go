package leases

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promise (docs/design.md, "Durability of each statement"; leases
// doc, "Hand-over"): a release sends NOTIFY pgfence_leases only when some
// client waits for or observes the lease (holds its wait key), so a
// release with nobody waiting sends nothing — a notifying commit
// serialises with every other — while one with a waiter does.
//
// A negative is checked without a timeout: after the release, the test
// sends a sentinel notification of its own. Notifications are delivered in
// commit order, so the release sent one exactly when it arrives before the
// sentinel.

// notifyWatch listens on pgfence_leases on a connection of its own.
type notifyWatch struct {
	t    *testing.T
	conn *pgx.Conn
	pool *pgxpool.Pool
}

func watchNotifications(t *testing.T, ctx context.Context, pool *pgxpool.Pool) *notifyWatch {
	t.Helper()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `LISTEN pgfence_leases`); err != nil {
		t.Fatal(err)
	}
	return &notifyWatch{t: t, conn: conn, pool: pool}
}

// sentBefore sends sentinel and returns the payloads (listeners' probes
// left out) that arrived before it.
func (w *notifyWatch) sentBefore(ctx context.Context, sentinel string) []string {
	w.t.Helper()
	if _, err := w.pool.Exec(ctx, `SELECT pg_notify('pgfence_leases', $1)`, sentinel); err != nil {
		w.t.Fatal(err)
	}
	var got []string
	for {
		n, err := w.conn.WaitForNotification(ctx)
		if err != nil {
			w.t.Fatalf("waiting for the sentinel %q: %v", sentinel, err)
		}
		switch {
		case n.Payload == sentinel:
			return got
		case !isProbe(n.Payload):
			got = append(got, n.Payload)
		}
	}
}

func TestReleaseNotifiesOnlyWhenWaitedFor(t *testing.T) {
	c, pool := setup(t)
	ctx := testContext(t)
	w := watchNotifications(t, ctx, pool)
	const ttl = time.Minute

	// Release with nobody waiting.
	l, err := c.TryAcquire(ctx, "quiet/release", ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.sentBefore(ctx, "sentinel/1"); len(got) != 0 {
		t.Errorf("Release with nobody waiting notified %q", got)
	}

	// A semaphore slot: neither the slot nor the semaphore is waited for.
	sem, err := c.Semaphore("quiet/sem", 2)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := sem.TryAcquire(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if err := sl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := w.sentBefore(ctx, "sentinel/2"); len(got) != 0 {
		t.Errorf("a slot's Release with nobody waiting notified %q", got)
	}

	// Close's batch release.
	c2 := newClient(t, pool)
	if _, err := c2.TryAcquire(ctx, "quiet/close", ttl); err != nil {
		t.Fatal(err)
	}
	if err := c2.Close(); err != nil {
		t.Fatal(err)
	}
	if got := w.sentBefore(ctx, "sentinel/3"); len(got) != 0 {
		t.Errorf("Close with nobody waiting notified %q", got)
	}

	// With a waiter on another client, the release notifies its name.
	l, err = c.TryAcquire(ctx, "loud", ttl)
	if err != nil {
		t.Fatal(err)
	}
	waiter := newClient(t, pool, WithPollInterval(time.Hour)) // woken by the notification, not by polling
	got := make(chan error, 1)
	go func() {
		l2, err := waiter.Acquire(ctx, "loud", ttl)
		if err == nil {
			err = l2.Release(ctx)
		}
		got <- err
	}()
	pgtest.WaitFor(t, testTimeout, "the waiter to hold the wait key of loud", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks
 WHERE locktype = 'advisory' AND granted AND mode = 'ShareLock'
   AND classid = 1885824613 AND objid::bigint = pgfence.wait_key('loud')::bigint & 4294967295 AND objsubid = 2`).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	notified := w.sentBefore(ctx, "sentinel/4")
	found := false
	for _, p := range notified {
		found = found || p == "loud"
	}
	if !found {
		// The waiter would wait for the expiry; Close (cleanup) ends it.
		t.Fatalf("Release of a lease with a waiter notified %q, want loud among them", notified)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
}
