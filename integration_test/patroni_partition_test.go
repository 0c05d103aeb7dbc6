//go:build linux

package integration_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/leases"
)

// farTTL is the TTL of the lease held on the far side of the partition.
// An isolated Patroni primary keeps accepting commits until it demotes
// itself (up to retry_timeout + loop_wait = 4s here), while no other node
// can lead before the leader key expires (ttl = 8s after its last update).
// A far holder's renewal can succeed on the isolated primary up to the
// demotion, so its deadline — last successful renewal + TTL − TTL/10 —
// precedes any new primary only when the TTL is below ttl − retry_timeout −
// loop_wait = 4s: 2s leaves room for scheduling delays.
const farTTL = 2 * time.Second

// TestPatroniPartition cuts the primary off from etcd, the other nodes and
// every client outside its namespace (its link on the bridge goes down).
// Patroni on it cannot renew the leader key and demotes it; another node
// is promoted once the key expires; the load's clients fail over. A client
// on the primary's side of the partition (connected from inside its
// namespace) holds a lease and writes under it: its writes must stop, its
// holder must be told it lost the lease by its own deadline — before the
// lease can be granted on the new primary — and its token must be stale
// there.
func TestPatroniPartition(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		sync bool
	}{{"async", false}, {"sync", true}} {
		t.Run(c.name, func(t *testing.T) {
			p, load, old := startScenario(t, c.sync)
			ctx := ctxT(t, 3*time.Minute)
			fw := startFarWriter(t, old)
			pause(ctx, time.Second)

			start := time.Now()
			if err := old.Isolate(); err != nil {
				t.Fatal(err)
			}
			fault := time.Now()
			t.Cleanup(func() { _ = old.Heal() })
			next, err := p.WaitLeader(time.Minute, old)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s isolated; %s leads %v later", old.Name(), next.Name(), time.Since(fault).Round(time.Millisecond))

			// The lease is granted on the new side once its row expires
			// there.
			near := newLeases(t, load.mh, "near")
			var taken *leases.Lease
			mustWait(t, time.Minute, "the far lease to be granted on the new primary", func() (bool, error) {
				octx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				l, err := near.TryAcquire(octx, "ha/far", 30*time.Second)
				taken = l
				return err == nil, err // the last error is reported if it never is
			})
			takenAt := time.Now()
			fr := fw.stop()
			t.Logf("far side: last fenced write committed %v after the isolation (%d committed after it); lease lost %v after it (%v); granted on the new side %v after it",
				fr.lastOK.Sub(fault).Round(time.Millisecond), fr.okAfter(fault), fr.lostAt.Sub(fault).Round(time.Millisecond), fr.lostErr, takenAt.Sub(fault).Round(time.Millisecond))
			switch {
			case fr.lostAt.IsZero():
				t.Errorf("the far holder was never told it lost its lease")
			case !fr.lostAt.Before(takenAt):
				t.Errorf("the far holder learnt of its loss %v after the new side was granted the lease", fr.lostAt.Sub(takenAt))
			case !errors.Is(fr.lostErr, leases.ErrLost):
				t.Errorf("far lease: Err() = %v, want ErrLost", fr.lostErr)
			}
			if !fr.lastOK.Before(takenAt) {
				t.Errorf("a far write committed %v after the new side was granted the lease", fr.lastOK.Sub(takenAt))
			}
			// The far token is stale on the new primary.
			err = fencing.InTx(ctx, load.mh, fr.token, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `UPDATE ha_items SET holder = 'far-stale' WHERE id = 200`)
				return err
			})
			if !fencing.IsStale(err) {
				t.Errorf("the far holder's write on the new primary = %v, want stale", err)
			}
			if taken.Fence() <= fr.token.Fence {
				t.Errorf("the new side's fence %d does not exceed the far holder's %d", taken.Fence(), fr.token.Fence)
			}
			_ = taken.Release(ctx)
			if !c.sync {
				// Before Heal: rejoining, the old primary rewinds its WAL.
				load.lost = lostCommits(t, p, next, saveWAL(t, old), fault)
			}
			r := load.check(start, fault, c.sync)
			t.Logf("partition (%s): %v", c.name, r)
			if err := old.Heal(); err != nil {
				t.Error(err)
			}
		})
	}
}

// farWriter is a lease holder on the primary's side of a partition: a pool
// dialling from inside the node's namespace, a lease (farTTL), a goroutine
// writing row 200 of ha_items under its token every 50ms, and one noting
// when the lease is lost. stop ends both.
type farWriter struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	lease  *leases.Lease

	mu     sync.Mutex
	oks    []time.Time
	lostAt time.Time
}

// farResult is what the far side saw.
type farResult struct {
	token   fencing.Token
	lastOK  time.Time
	oks     []time.Time
	lostAt  time.Time
	lostErr error
}

func (r farResult) okAfter(t time.Time) int {
	n := 0
	for _, ok := range r.oks {
		if ok.After(t) {
			n++
		}
	}
	return n
}

func startFarWriter(t *testing.T, n *pgcluster.PatroniNode) *farWriter {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	pool := newPool(t, n.URL("postgres"), "ha-far", func(c *pgxpool.Config) { c.ConnConfig.DialFunc = n.Dial })
	l, err := newLeases(t, pool, "far").TryAcquire(ctx, "ha/far", farTTL)
	if err != nil {
		t.Fatalf("far grant: %v", err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	fw := &farWriter{cancel: cancel, lease: l}
	fw.wg.Add(2)
	go func() {
		defer fw.wg.Done()
		for wctx.Err() == nil {
			octx, cancel := context.WithTimeout(wctx, time.Second)
			err := fencing.InTx(octx, pool, l.Token(), func(tx pgx.Tx) error {
				_, err := tx.Exec(octx, `INSERT INTO ha_items (id, holder) VALUES (200, 'far')
				                         ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder`)
				return err
			})
			cancel()
			if err == nil {
				fw.mu.Lock()
				fw.oks = append(fw.oks, time.Now())
				fw.mu.Unlock()
			}
			pause(wctx, 50*time.Millisecond)
		}
	}()
	go func() {
		defer fw.wg.Done()
		select {
		case <-l.Done():
			fw.mu.Lock()
			fw.lostAt = time.Now()
			fw.mu.Unlock()
		case <-wctx.Done():
		}
	}()
	t.Cleanup(func() { fw.stop() }) // before the pool's and client's cleanups
	return fw
}

// stop ends the writer and returns what it saw. Safe to call twice.
func (fw *farWriter) stop() farResult {
	fw.cancel()
	fw.wg.Wait()
	fw.mu.Lock()
	defer fw.mu.Unlock()
	r := farResult{token: fw.lease.Token(), oks: fw.oks, lostAt: fw.lostAt, lostErr: fw.lease.Err()}
	if len(fw.oks) > 0 {
		r.lastOK = fw.oks[len(fw.oks)-1]
	}
	return r
}
