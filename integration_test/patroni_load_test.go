//go:build linux

package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// haLoad is the load a Patroni scenario runs its fault under, through both
// ways a client finds the primary — the multi-host URL with
// target_session_attrs=read-write and HAProxy:
//
//   - holders: leases granted at the start (TTL holderTTL) and kept by
//     their client's keepalive, never released: how many survive the fault
//     is what a switchover costs;
//   - waiters: two goroutines blocking in Acquire on one contended lease,
//     each writing a fenced row while it holds it;
//   - churn: a goroutine granting short leases in turn, writing a ledger row
//     under each grant's token (an acknowledged grant and write), and
//     releasing them;
//   - lockers: two advisory-lock holders that must be told when they lose
//     their locks;
//   - linear workers (startLinear): processes running roleLinear on one
//     lease and register, for porcupine.
//
// The load goroutines are owned by haLoad: stop cancels and waits for them.
type haLoad struct {
	t      *testing.T
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mh, ha *pgxpool.Pool // multi-host URL; HAProxy

	mu      sync.Mutex
	grants  []grantRec
	ledger  []ledgerRec
	writes  map[string]int // fenced writes by outcome: ok, stale, failed
	locks   []*lockRec
	holders []*leases.Lease
	linear  []*worker
	// lost are commits to the register or the leases that the old primary
	// made before the fault and the new one never received (lostCommits):
	// asynchronous replication allows that, and then the linear history
	// need not be linearizable.
	lost []pgcluster.LostCommit
}

// grantRec is one successful grant: its lease, fence, and when the call
// started and returned.
type grantRec struct {
	name      string
	fence     int64
	call, ret time.Time
}

// ledgerRec is one acknowledged (committed) fenced insert of the churn.
type ledgerRec struct {
	id  int64
	ret time.Time
}

// lockRec is one advisory lock held by a locker: when it was granted and
// when its holder was told it was lost (zero while held).
type lockRec struct {
	name           string
	granted, lost  time.Time
	err            error
	unlockedByTest bool
}

const (
	haHolders = 4
	churnTTL  = 5 * time.Second
)

// startLoad creates the scenario's tables and starts the load.
func startLoad(t *testing.T, p *pgcluster.Patroni, holderTTL time.Duration) *haLoad {
	t.Helper()
	ctx := ctxT(t, time.Minute)
	l := &haLoad{t: t, writes: map[string]int{}}
	l.mh = newPool(t, p.URL("postgres"), "ha-multihost")
	l.ha = newPool(t, p.HAProxyURL("postgres"), "ha-haproxy")
	protectedTable(t, l.mh, "ha_items", "id int PRIMARY KEY, holder text NOT NULL")
	protectedTable(t, l.mh, "ha_ledger", "id bigserial PRIMARY KEY, name text NOT NULL")
	protectedTable(t, l.mh, "reg", "id int PRIMARY KEY, value bigint NOT NULL")

	holderClient := newLeases(t, l.ha, "holder")
	for i := range haHolders {
		call := time.Now()
		h, err := holderClient.TryAcquire(ctx, fmt.Sprintf("ha/holder/%d", i), holderTTL)
		if err != nil {
			t.Fatalf("grant holder %d: %v", i, err)
		}
		l.holders = append(l.holders, h)
		l.grants = append(l.grants, grantRec{h.Name(), h.Fence(), call, time.Now()})
	}
	lctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	t.Cleanup(l.stop) // before the pools' and clients' cleanups: registered after them
	churn := newLeases(t, l.mh, "churn")
	waiters := newLeases(t, l.ha, "waiter")
	l.wg.Add(5)
	go func() { defer l.wg.Done(); l.churn(lctx, churn) }()
	for i := range 2 {
		go func() { defer l.wg.Done(); l.wait(lctx, waiters, i) }()
	}
	for i, pool := range []*pgxpool.Pool{l.mh, l.ha} {
		locker := newLocker(t, pool, pglock.WithLivenessCheck(200*time.Millisecond, time.Second))
		go func() { defer l.wg.Done(); l.lock(lctx, locker, fmt.Sprintf("ha/lock/%d", i)) }()
	}
	// Warm up: every lock held, and the churn granting.
	mustWait(t, 30*time.Second, "the load to start", func() (bool, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.locks) >= 2 && len(l.ledger) >= 10, nil
	})
	return l
}

// stop ends the load and waits for its goroutines. Safe to call twice.
func (l *haLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func (l *haLoad) recordGrant(g grantRec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grants = append(l.grants, g)
}

func (l *haLoad) recordWrite(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil:
		l.writes["ok"]++
	case fencing.IsStale(err):
		l.writes["stale"]++
	default:
		l.writes["failed"]++
	}
}

// pause is a short pace between operations, cut short by ctx.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (l *haLoad) churn(ctx context.Context, c *leases.Client) {
	for i := 0; ctx.Err() == nil; i++ {
		name := fmt.Sprintf("ha/churn/%d", i%8)
		call := time.Now()
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lease, err := c.TryAcquire(octx, name, churnTTL)
		if err != nil {
			cancel()
			pause(ctx, 50*time.Millisecond)
			continue
		}
		l.recordGrant(grantRec{name, lease.Fence(), call, time.Now()})
		var id int64
		err = fencing.InTx(octx, l.mh, lease.Token(), func(tx pgx.Tx) error {
			return tx.QueryRow(octx, `INSERT INTO ha_ledger (name) VALUES ($1) RETURNING id`, name).Scan(&id)
		})
		l.recordWrite(err)
		if err == nil {
			l.mu.Lock()
			l.ledger = append(l.ledger, ledgerRec{id, time.Now()})
			l.mu.Unlock()
		}
		_ = lease.Release(octx)
		cancel()
		pause(ctx, 20*time.Millisecond)
	}
}

func (l *haLoad) wait(ctx context.Context, c *leases.Client, i int) {
	for ctx.Err() == nil {
		call := time.Now()
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		lease, err := c.Acquire(octx, "ha/contended", churnTTL)
		if err != nil {
			cancel()
			pause(ctx, 100*time.Millisecond)
			continue
		}
		l.recordGrant(grantRec{lease.Name(), lease.Fence(), call, time.Now()})
		l.recordWrite(fencing.InTx(octx, l.ha, lease.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(octx, `INSERT INTO ha_items (id, holder) VALUES (100, $1)
			                         ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder`, fmt.Sprint("waiter", i))
			return err
		}))
		pause(ctx, 100*time.Millisecond)
		_ = lease.Release(octx)
		cancel()
	}
}

func (l *haLoad) lock(ctx context.Context, locker *pglock.Locker, name string) {
	for ctx.Err() == nil {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		lk, err := locker.Lock(octx, name)
		cancel()
		if err != nil {
			pause(ctx, 100*time.Millisecond)
			continue
		}
		rec := &lockRec{name: name, granted: time.Now()}
		l.mu.Lock()
		l.locks = append(l.locks, rec)
		l.mu.Unlock()
		select {
		case <-lk.Done():
			l.mu.Lock()
			rec.lost, rec.err = time.Now(), lk.Err()
			l.mu.Unlock()
		case <-ctx.Done():
			uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = lk.Unlock(uctx)
			cancel()
			l.mu.Lock()
			rec.unlockedByTest = true
			l.mu.Unlock()
		}
	}
}

// startLinear starts n roleLinear worker processes on lease and register
// "reg" (TTL 2s), the even ones through the multi-host URL, the odd ones
// through HAProxy.
func (l *haLoad) startLinear(p *pgcluster.Patroni, n int) {
	for i := range n {
		u := p.URL("postgres")
		if i%2 == 1 {
			u = p.HAProxyURL("postgres")
		}
		l.linear = append(l.linear, startWorker(l.t, workerConfig{Role: "linear", ID: fmt.Sprintf("c%d", i), URL: u,
			Name: "reg", TTL: 2 * time.Second, Table: "reg", Periods: 5000}))
	}
}

// checkLinear stops the linear workers and checks their history with
// porcupine.
func (l *haLoad) checkLinear() {
	t := l.t
	var history []porcupine.Operation
	for i, w := range l.linear {
		w.send("stop")
		w.await("done", time.Minute)
		w.finish(30 * time.Second)
		history = append(history, linearOps(i, w.seen)...)
	}
	counts := map[string]int{}
	for _, op := range history {
		counts[op.Input.(opRecord).Kind+"/"+op.Output.(opRecord).Out]++
	}
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(registerModel, history, time.Minute)
	t.Logf("linearizability: %d operations (%s): porcupine says %s in %v", len(history), describeCounts(counts), res, time.Since(start).Round(time.Millisecond))
	switch {
	case res == porcupine.Ok:
	case len(l.lost) > 0:
		t.Logf("NOT CHECKED: the history of grants and fenced writes across the fault is %s, and %d transactions that wrote the register or the leases committed on the old primary before the fault but never reached the new one (%+v): asynchronous replication loses such commits (docs/production.md, \"HA and failover\"), so their history need not be linearizable",
			res, len(l.lost), l.lost)
	default:
		t.Errorf("the history of grants and fenced writes across the fault is %s, want Ok", res)
	}
}

// saveWAL copies the newest WAL of node, a primary that has just been
// killed or cut off, before Patroni rewinds it: lostCommits reads it.
func saveWAL(t *testing.T, node *pgcluster.PatroniNode) string {
	t.Helper()
	dir := t.TempDir()
	if err := pgcluster.SaveWAL(node.DataDir(), dir); err != nil {
		t.Logf("cannot tell which commits the failover lost: %v", err)
		return ""
	}
	return dir
}

// lostCommits are the transactions that wrote the register or the leases,
// committed on the old primary before the fault (at before), and are
// missing on the new primary next: WAL saved by saveWAL past the point
// where next's timeline forked off. When it cannot tell, it says so and
// returns none, so that the check stays strict.
func lostCommits(t *testing.T, p *pgcluster.Patroni, next *pgcluster.PatroniNode, wal string, before time.Time) []pgcluster.LostCommit {
	t.Helper()
	if wal == "" {
		return nil
	}
	ctx := ctxT(t, time.Minute)
	url := next.URL("postgres")
	tli, lsn, err := pgcluster.Fork(ctx, url)
	if err != nil {
		t.Logf("cannot tell which commits the failover lost: %v", err)
		return nil
	}
	all, err := pgcluster.LostCommits(ctx, p.Tool("pg_waldump"), wal, tli, lsn)
	if err != nil {
		t.Logf("cannot tell which commits the failover lost: %v", err)
		return nil
	}
	watched := map[string]bool{}
	for _, rel := range []string{"reg", "pgfence.leases"} {
		f, err := pgcluster.RelFile(ctx, url, rel)
		if err != nil || f == "" {
			t.Logf("cannot tell which commits the failover lost: the file of %s: %q, %v", rel, f, err)
			return nil
		}
		watched[f] = true
	}
	var lost []pgcluster.LostCommit
	for _, c := range all {
		if c.At.Before(before) && slices.ContainsFunc(c.Rels, func(r string) bool { return watched[r] }) {
			lost = append(lost, c)
		}
	}
	t.Logf("the new primary's timeline forked off timeline %d at %s: %d transactions committed past it on the old primary, %d of them before the fault and to the register or the leases",
		tli, lsn, len(all), len(lost))
	return lost
}

// report is what a scenario measured around the fault at time fault.
type report struct {
	firstGrant  time.Duration // fault to the first grant asked for after the fault was in place
	grantOutage time.Duration // longest gap between grants after the fault began
	resumed     time.Duration // fault to the grant that ended that gap
	holdersKept int
	locksLost   int // of the locks held at the fault, how many holders were told
	locksHeld   int
	ledgerLost  int // acknowledged ledger rows (before the fault) missing afterwards
	grants      int
}

func (r report) String() string {
	return fmt.Sprintf("first grant asked for after the fault was in place returned %v after it began; longest grant outage %v, ended %v after the fault; holders kept %d/%d; lock holders told of the loss %d/%d; acknowledged writes lost %d; %d grants",
		r.firstGrant.Round(time.Millisecond), r.grantOutage.Round(time.Millisecond), r.resumed.Round(time.Millisecond), r.holdersKept, haHolders, r.locksLost, r.locksHeld, r.ledgerLost, r.grants)
}

// waitGrantAfter waits until the load has been granted a lease it asked
// for after at, and returns when that grant returned.
func (l *haLoad) waitGrantAfter(at time.Time, timeout time.Duration) time.Time {
	l.t.Helper()
	var first time.Time
	mustWait(l.t, timeout, "a grant after the fault", func() (bool, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, g := range l.grants {
			if g.call.After(at) {
				first = g.ret
				return true, nil
			}
		}
		return false, nil
	})
	return first
}

// check stops the load (linear workers first) and checks the invariants
// around a fault injected from start to end (the kill, the isolation, the
// switchover command): fences of grants asked for after end exceed those
// of grants acknowledged before start; locks held at start were reported
// lost; with noLoss, no ledger row acknowledged before start was lost
// (synchronous replication). It returns the figures, timed from start.
func (l *haLoad) check(start, end time.Time, noLoss bool) report {
	t := l.t
	t.Helper()
	if len(l.linear) > 0 {
		l.checkLinear()
	}
	l.stop()
	ctx := ctxT(t, time.Minute)
	l.mu.Lock()
	defer l.mu.Unlock()
	var r report
	r.grants = len(l.grants)

	// Fences: every grant asked for after the fault exceeds every grant
	// acknowledged before it, and per lease fences grow in real-time order.
	var maxBefore, minAfter int64 = 0, math.MaxInt64
	var rets []time.Time
	for _, g := range l.grants {
		if g.ret.Before(start) {
			maxBefore = max(maxBefore, g.fence)
		}
		if g.call.After(end) {
			minAfter = min(minAfter, g.fence)
			if r.firstGrant == 0 || g.ret.Sub(start) < r.firstGrant {
				r.firstGrant = g.ret.Sub(start)
			}
		}
		if g.ret.After(start) {
			rets = append(rets, g.ret)
		}
	}
	if minAfter == math.MaxInt64 {
		t.Errorf("no grant after the fault")
	} else if minAfter <= maxBefore {
		t.Errorf("a fence granted after the fault (%d) does not exceed every fence granted before it (%d)", minAfter, maxBefore)
	}
	byName := map[string][]grantRec{}
	for _, g := range l.grants {
		byName[g.name] = append(byName[g.name], g)
	}
	for name, gs := range byName {
		for _, a := range gs {
			for _, b := range gs {
				if a.ret.Before(b.call) && a.fence >= b.fence {
					t.Errorf("lease %s: grant with fence %d came after the grant with fence %d", name, b.fence, a.fence)
				}
			}
		}
	}
	sort.Slice(rets, func(i, j int) bool { return rets[i].Before(rets[j]) })
	prev := start
	for _, r2 := range rets {
		if gap := r2.Sub(prev); gap > r.grantOutage {
			r.grantOutage, r.resumed = gap, r2.Sub(start)
		}
		prev = r2
	}

	// Advisory locks held at the fault: each holder was told it lost it.
	for _, lk := range l.locks {
		if lk.granted.After(start) || (!lk.lost.IsZero() && lk.lost.Before(start)) {
			continue
		}
		r.locksHeld++
		switch {
		case lk.lost.IsZero():
			t.Errorf("advisory lock %s, held since before the fault, was never reported lost", lk.name)
		case !errors.Is(lk.err, pglock.ErrLost):
			t.Errorf("advisory lock %s: Err() = %v, want ErrLost", lk.name, lk.err)
		default:
			r.locksLost++
		}
	}

	// Holders: kept means never lost and renewable on the new primary.
	for _, h := range l.holders {
		if h.Err() == nil && h.Renew(ctx) == nil {
			r.holdersKept++
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = h.Release(rctx)
		cancel()
	}

	// Acknowledged ledger rows.
	var present []int64
	rows, err := l.mh.Query(ctx, `SELECT id FROM ha_ledger`)
	if err == nil {
		present, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	if err != nil {
		t.Errorf("read the ledger: %v", err)
	}
	for _, e := range l.ledger {
		if e.ret.Before(start) && !slices.Contains(present, e.id) {
			r.ledgerLost++
		}
	}
	if noLoss && r.ledgerLost > 0 {
		t.Errorf("%d acknowledged fenced writes (one per grant) were lost across the fault with synchronous replication", r.ledgerLost)
	}
	if l.writes["ok"] == 0 {
		t.Errorf("no fenced write succeeded")
	}
	t.Logf("fenced writes: %d ok, %d stale, %d failed (connection or server errors during the fault)", l.writes["ok"], l.writes["stale"], l.writes["failed"])
	return r
}
