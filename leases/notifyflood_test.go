package leases

import (
	"errors"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestForgedNotificationsCoalesce (scenario: a hostile role floods the
// notification channel). Any role that can connect may NOTIFY
// pgfence_leases with a held lease's name. The holder rechecks its grant
// on each notification; it started a goroutine, and a renewal, for every
// one: 8,000 forged notifications in under a second left thousands of
// goroutines queued for renewals (7,664 at the peak, measured before the
// fix). Rechecks of one lease now coalesce, and a real force-release
// after the flood is still learned at once.
//
// Not parallel: it counts the process's goroutines.
func TestForgedNotificationsCoalesce(t *testing.T) {
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	holder := newClient(t, pool)
	waitListening(t, holder)
	ctx := testContext(t)
	// A TTL whose scheduled renewals (every 20s) cannot be what tells the
	// holder of the force-release below within its 10s bound.
	l, err := holder.TryAcquire(ctx, "flooded", time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	base := runtime.NumGoroutine()
	var (
		mu   sync.Mutex
		peak int
	)
	sampled := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			mu.Lock()
			peak = max(peak, runtime.NumGoroutine())
			mu.Unlock()
		}
	}()
	attacker := pgtest.PoolFor(t, url, func(c *pgxpool.Config) { c.MaxConns = 4 })
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 { // each its own transaction: PostgreSQL folds repeats within one
				if _, err := attacker.Exec(ctx, `SELECT pg_notify('pgfence_leases', 'flooded')`); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// The holder has taken in the flood once its listener has seen a
	// notification sent after it.
	if _, err := attacker.Exec(ctx, `SELECT pg_notify('pgfence_leases', 'flooded')`); err != nil {
		t.Fatal(err)
	}
	settled := pgtest.Poll(30*time.Second, func() bool { return runtime.NumGoroutine() <= base+10 })
	close(stop)
	<-sampled
	if !settled {
		// An earlier failure here, under heavy load, left nothing to read:
		// say which goroutines were left (identical stacks counted once).
		var stacks strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
		t.Fatalf("the holder's goroutines did not settle within 30s: %d, base %d; goroutines:\n%s", runtime.NumGoroutine(), base, stacks.String())
	}
	mu.Lock()
	defer mu.Unlock()
	// Bound: the attacker's 4 goroutines and its pool's, the sampler, and
	// at most two per recheck of the one lease; without coalescing the
	// peak was thousands above the base.
	if peak > base+100 {
		t.Errorf("goroutines peaked at %d during 8,000 forged notifications (base %d)", peak, base)
	}
	t.Logf("goroutines: base %d, peak %d", base, peak)
	if err := l.Err(); err != nil {
		t.Fatalf("the flood cost the holder its lease: %v", err)
	}

	admin := newClient(t, pool)
	if err := admin.ForceRelease(ctx, "flooded"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
		if !errors.Is(l.Err(), ErrLost) {
			t.Errorf("lease Err = %v, want ErrLost", l.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not learn of a force-release after the flood within 10s")
	}
}
