package integration_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
)

// Releases commit asynchronously. The safety argument: a release lost in a
// crash leaves the grant it ended in place until its expiry, as a crashed
// holder would; it draws no fence, so nothing is reordered; and WAL is
// flushed in order, so a release that precedes a durable commit survives.
// These tests crash the server under load right after asynchronous
// releases (wal_writer_delay 10s keeps released commits in WAL buffers)
// and check, per lease, that the row after restart is the last
// acknowledged grant — released or still live — and never anything else;
// that no fence is issued twice; and that a waiter gets each lease no
// later than its expiry.

// releaseLoad runs workers that each grant and release their own leases in
// a loop until the server goes away, and reports per lease the last
// acknowledged grant and whether a grant was in flight at the end.
type releaseLoad struct {
	mu       sync.Mutex
	last     map[string]leases.Info // last acknowledged grant
	released map[string]bool        // its release was acknowledged
	inFlight map[string]bool        // a grant was sent but not answered
	maxFence int64
}

const asyncTTL = 5 * time.Second // no renewal (at TTL/3) during the ~0.5s load; expiry bounds the wait after

func runReleaseLoad(t *testing.T, u string, workers int, crash func()) *releaseLoad {
	t.Helper()
	ld := &releaseLoad{last: map[string]leases.Info{}, released: map[string]bool{}, inFlight: map[string]bool{}}
	pool := newPool(t, u, "async-release")
	c := newLeases(t, pool, "async")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	granted := make(chan struct{}, workers*4)
	for w := range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				name := fmt.Sprintf("async/%d/%d", w, i%4)
				ld.mu.Lock()
				ld.inFlight[name] = true
				ld.mu.Unlock()
				l, err := c.TryAcquire(ctx, name, asyncTTL)
				if err != nil {
					return // the server went away (or the lease is still held after a lost release: stop)
				}
				ld.mu.Lock()
				ld.inFlight[name] = false
				ld.last[name] = leases.Info{Name: name, Owner: l.Owner(), Fence: l.Fence(), ExpiresAt: l.ExpiresAt()}
				ld.released[name] = false
				ld.maxFence = max(ld.maxFence, l.Fence())
				ld.mu.Unlock()
				select {
				case granted <- struct{}{}:
				default:
				}
				if err := l.Release(ctx); err != nil {
					return
				}
				ld.mu.Lock()
				ld.released[name] = true
				ld.mu.Unlock()
			}
		})
	}
	for range workers * 4 { // everyone is going
		<-granted
	}
	time.Sleep(300 * time.Millisecond) // load for a while: the crash lands among releases, not at a chosen point
	crash()
	cancel()
	wg.Wait()
	return ld
}

// check verifies the invariants on the server at u after the crash.
func (ld *releaseLoad) check(t *testing.T, u string) {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	conn := haConn(t, u)
	var lost, kept int
	for name, g := range ld.last {
		var fence int64
		var expires time.Time
		var live bool
		err := conn.QueryRow(ctx, `SELECT fence, expires_at, expires_at > clock_timestamp() FROM pgfence.leases WHERE name = $1`, name).Scan(&fence, &expires, &live)
		if err != nil {
			t.Errorf("%s: the last acknowledged grant (fence %d) is gone: %v", name, g.Fence, err)
			continue
		}
		switch {
		case fence == g.Fence && !live:
			kept++ // released (or expired)
		case fence == g.Fence && expires.Equal(g.ExpiresAt):
			if !ld.released[name] {
				kept++ // never released: still held, as it should be
			} else {
				lost++ // the release was lost: the grant stays until its expiry
			}
		case fence > g.Fence && ld.inFlight[name]:
			kept++ // a grant sent before the crash committed; its answer was lost
		default:
			t.Errorf("%s after the crash: fence %d expires %v live %v; the last acknowledged grant was fence %d expiring %v (released %v, grant in flight %v)",
				name, fence, expires, live, g.Fence, g.ExpiresAt, ld.released[name], ld.inFlight[name])
		}
	}
	t.Logf("%d leases as acknowledged, %d acknowledged releases lost (their grants stay until expiry)", kept, lost)

	// Every lease can be had again, by its expiry at the latest, with a
	// fence above every fence acknowledged before the crash.
	pool := newPool(t, u, "async-after")
	c := newLeases(t, pool, "after")
	for name, g := range ld.last {
		deadline := time.Until(g.ExpiresAt) + 5*time.Second // slack for a loaded machine
		actx, cancel := context.WithTimeout(ctx, max(deadline, 5*time.Second))
		l, err := c.Acquire(actx, name, time.Minute)
		cancel()
		if err != nil {
			t.Errorf("%s: not granted by its expiry (%v): %v", name, g.ExpiresAt, err)
			continue
		}
		if l.Fence() <= ld.maxFence {
			t.Errorf("%s: fence %d after the crash; fence %d was acknowledged before it: reissued", name, l.Fence(), ld.maxFence)
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("release %s: %v", name, err)
		}
	}
}

func TestAsyncReleaseCrash(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"immediate", "kill"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			c := pgtest.StartCluster(t, pgtest.WithSetting("wal_writer_delay", "10s"))
			ctx := ctxT(t, 2*time.Minute)
			u := c.URL("postgres")
			if err := migrations.Up(ctx, u); err != nil {
				t.Fatal(err)
			}
			ld := runReleaseLoad(t, u, 8, func() {
				var err error
				if mode == "kill" {
					err = c.Kill()
				} else {
					err = c.Stop("immediate")
				}
				if err != nil {
					t.Errorf("crash (%s): %v", mode, err)
				}
			})
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			ld.check(t, u)
		})
	}
}

// TestAsyncReleaseFailoverSync: with a synchronous standby, grants are on
// the standby when acknowledged; asynchronous releases may not be. After
// a failover the same invariants hold on the new primary.
func TestAsyncReleaseFailoverSync(t *testing.T) {
	t.Parallel()
	p := startPair(t, true, false)
	ld := runReleaseLoad(t, p.primary.URL("postgres"), 8, func() {
		if err := p.primary.Kill(); err != nil {
			t.Errorf("kill the primary: %v", err)
		}
	})
	if err := p.standby.Promote(ctxT(t, time.Minute)); err != nil {
		t.Fatal(err)
	}
	ld.check(t, p.standby.URL("postgres"))
}
