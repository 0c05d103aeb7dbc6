package integration_test

import (
	"context"
	"fmt"
	"sort"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

func init() { workerRoles["semaphore"] = roleSemaphore }

// semSlots is the size of the semaphore the "semaphore" workers share.
const semSlots = 2

// TestSemaphoreAcrossProcesses: five worker processes take slots of a
// semaphore of 2, 12 rounds each, recording each hold in a protected table
// with fenced writes (start, then end, by the database clock). One worker
// is SIGKILLed and another SIGSTOPped (and later resumed) while holding a
// slot. Never are more than 2 holds live at once — a hold that never
// recorded its end (the killed one's, or the frozen one's, whose late
// write the guard rejects) counts as live until the next grant of its
// slot — and each slot's fences increase in grant order.
func TestSemaphoreAcrossProcesses(t *testing.T) {
	t.Parallel()
	const workers, rounds = 5, 12
	u := setup(t)
	pool := newPool(t, u, "parent")
	protectedTable(t, pool, "holds", "slot text NOT NULL, grant_fence bigint PRIMARY KEY, worker text NOT NULL, "+
		"t0 timestamptz NOT NULL DEFAULT clock_timestamp(), t1 timestamptz")
	ws := make([]*worker, workers)
	for i := range ws {
		ws[i] = startWorker(t, workerConfig{Role: "semaphore", ID: fmt.Sprintf("w%d", i), URL: u,
			Name: "pool", TTL: time.Second, Periods: rounds, Table: "holds"})
	}
	victim, killed := firstEvent(t, ws, "holding")
	victim.kill(syscall.SIGKILL)
	_ = victim.exitErr()
	t.Logf("SIGKILLed %s holding slot %d (fence %d)", victim.id, killed.Period, killed.Fence)
	var alive []*worker
	for _, w := range ws {
		if w != victim {
			alive = append(alive, w)
		}
	}
	// The frozen holder must be stopped outside a transaction: stopped in
	// its end-of-hold fenced transaction, it would hold its slot's fence
	// lock, and the takeover waits for that transaction (by design) until
	// it resumes, which this test does only after the takeover.
	var sleeper *worker
	var frozen event
	for attempt := 1; ; attempt++ {
		sleeper, frozen = firstEvent(t, alive, "holding")
		sleeper.kill(syscall.SIGSTOP)
		if !inTransaction(t, pool, sleeper.id) {
			break
		}
		t.Logf("stopped %s inside a transaction: resumed it, choosing again", sleeper.id)
		if attempt == 10 {
			t.Fatalf("%d stops of a holder all landed inside a transaction", attempt)
		}
		sleeper.kill(syscall.SIGCONT)
	}
	t.Logf("SIGSTOPped %s holding slot %d (fence %d)", sleeper.id, frozen.Period, frozen.Fence)
	// Its slot is granted again, then it resumes.
	mustWait(t, time.Minute, "the frozen holder's slot granted again", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM holds WHERE slot = $1 AND grant_fence > $2`,
			fmt.Sprintf("pool#%d", frozen.Period), frozen.Fence).Scan(&n)
		return n > 0, err
	})
	sleeper.kill(syscall.SIGCONT)

	awaitDone(alive)
	if t.Failed() {
		return
	}

	ctx := ctxT(t, 30*time.Second)
	rows, err := pool.Query(ctx, `SELECT slot, grant_fence, worker, t0, t1 FROM holds ORDER BY t0`)
	if err != nil {
		t.Fatal(err)
	}
	type hold struct {
		Slot   string
		Fence  int64
		Worker string
		T0     time.Time
		T1     *time.Time
	}
	holds, err := pgx.CollectRows(rows, pgx.RowToStructByPos[hold])
	if err != nil {
		t.Fatal(err)
	}
	// A hold without an end lasts until the next grant of its slot.
	ends := make([]time.Time, len(holds))
	lastOfSlot := map[string]int{}
	open := 0
	for i, h := range holds {
		if j, ok := lastOfSlot[h.Slot]; ok {
			if holds[j].Fence >= h.Fence {
				t.Errorf("slot %s: fence %d granted after fence %d", h.Slot, h.Fence, holds[j].Fence)
			}
			if holds[j].T1 == nil {
				ends[j] = h.T0
			}
		}
		lastOfSlot[h.Slot] = i
		if h.T1 != nil {
			ends[i] = *h.T1
		} else {
			open++
			ends[i] = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		}
	}
	for _, j := range lastOfSlot {
		if holds[j].T1 == nil {
			ends[j] = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		}
	}
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for i, h := range holds {
		edges = append(edges, edge{h.T0, +1}, edge{ends[i], -1})
	}
	sort.Slice(edges, func(a, b int) bool {
		if edges[a].at.Equal(edges[b].at) {
			return edges[a].delta < edges[b].delta // an end before a start at the same instant
		}
		return edges[a].at.Before(edges[b].at)
	})
	live, most := 0, 0
	for _, e := range edges {
		live += e.delta
		most = max(most, live)
	}
	if most > semSlots {
		t.Errorf("%d holds live at once, want at most %d", most, semSlots)
	}
	if most < semSlots {
		t.Errorf("at most %d holds at once: the semaphore was never full (no contention?)", most)
	}
	if open < 1 || open > 2 {
		t.Errorf("%d holds without an end, want 1 or 2 (the killed and the frozen worker's)", open)
	}
	t.Logf("%d holds, at most %d at once, %d never ended", len(holds), most, open)
}

// inTransaction waits until no backend of the stopped worker id (its
// application_name, in this test's database) runs a statement, then
// reports whether one of them is inside a transaction. A statement the
// worker sent before it stopped is either answered by then, or a BEGIN not
// yet read, which takes no lock.
func inTransaction(t *testing.T, pool *pgxpool.Pool, id string) bool {
	t.Helper()
	var open int
	mustWait(t, 30*time.Second, id+"'s backends idle", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var active int
		err := pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE state = 'active'), count(*) FILTER (WHERE xact_start IS NOT NULL)
  FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1`, id).Scan(&active, &open)
		return active == 0, err
	})
	return open > 0
}

// firstEvent reads the events of ws as they come and returns the first
// worker to report ev, with that event.
func firstEvent(t *testing.T, ws []*worker, ev string) (*worker, event) {
	t.Helper()
	return firstMatch(t, ws, func(e event) bool { return e.Ev == ev })
}

// roleSemaphore takes a slot of semaphore cfg.Name (semSlots slots)
// cfg.Periods times; each time it records the hold in cfg.Table with a
// fenced insert (start), holds a moment, records its end with a fenced
// update, and releases. A rejected write (stale: the slot was lost) ends
// that round. Events: "holding" (period = slot, fence), "stale", "done".
func roleSemaphore(ctx context.Context, wk *workerSide) error {
	cfg := wk.cfg
	pool, client, closeAll, err := workerLeases(ctx, wk)
	if err != nil {
		return err
	}
	defer closeAll()
	sem, err := client.Semaphore(cfg.Name, semSlots)
	if err != nil {
		return err
	}
	table := pgx.Identifier{cfg.Table}.Sanitize()
	for range cfg.Periods {
		err := sem.Run(ctx, cfg.TTL, func(ctx context.Context, l *leases.Lease) error {
			err := fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+table+" (slot, grant_fence, worker) VALUES ($1, $2, $3)", l.Name(), l.Fence(), cfg.ID)
				return err
			})
			if err != nil {
				return err
			}
			wk.emit(event{Ev: "holding", Period: l.Slot(), Fence: l.Fence()})
			time.Sleep(30 * time.Millisecond) // hold a moment: a signal lands here
			// With a context of its own: a stale holder does not know.
			return fencing.InTx(context.WithoutCancel(ctx), pool, l.Token(), func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "UPDATE "+table+" SET t1 = clock_timestamp() WHERE grant_fence = $1", l.Fence())
				return err
			})
		})
		switch {
		case isStale(err) || isLeaseLost(err):
			wk.emit(event{Ev: "stale", Result: errKind(err), Err: errString(err)})
		case err != nil:
			return err
		}
	}
	wk.emit(event{Ev: "done"})
	return nil
}
