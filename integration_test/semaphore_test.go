package integration_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

func init() { workerRoles["semaphore"] = roleSemaphore }

// semSlots is the size of the semaphore the "semaphore" workers share.
const semSlots = 2

// TestSemaphoreAcrossProcesses: five worker processes take slots of a
// semaphore of 2, 12 rounds each, recording each hold in a protected table
// with fenced writes (start, then end, by the database clock). Each worker
// waits inside every hold, outside any transaction, for the test to let it
// go on; the test SIGKILLs the first holder there and SIGSTOPs the second,
// resuming it once its slot has been granted again. Never are more than 2
// holds live at once — a hold that never recorded its end (the killed
// one's, or the frozen one's, whose late write the guard rejects) counts as
// live until the next grant of its slot — and each slot's fences increase
// in grant order.
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
	f := driveHolders(t, ws)
	victim, killed, sleeper, frozen := f.victim, f.killed, f.sleeper, f.frozen
	if t.Failed() {
		return
	}
	for _, w := range ws {
		if w != victim {
			w.finish(30 * time.Second)
		}
	}
	if !slices.ContainsFunc(sleeper.seen, func(e event) bool { return e.Ev == "stale" }) {
		t.Errorf("%s, resumed after its slot was granted again, never reported its hold stale or lost", sleeper.id)
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
		if (h.Fence == killed.Fence || h.Fence == frozen.Fence) && h.T1 != nil {
			t.Errorf("the hold of fence %d (%s) recorded its end, want none: its worker was killed or frozen inside it", h.Fence, h.Worker)
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
	if open < 2 {
		t.Errorf("%d holds without an end, want at least 2 (the killed and the frozen worker's)", open)
	}
	t.Logf("%d holds, at most %d at once, %d never ended", len(holds), most, open)
}

// driveHolders answers the "holding" events of the semaphore workers ws
// until each of them but the killed one reports "done". The first holder
// is SIGKILLed and the second SIGSTOPped while they wait for their answer
// (inside the hold, outside a transaction); the frozen one is resumed, and
// let go on, once another worker holds its slot with a higher fence.
func driveHolders(t *testing.T, ws []*worker) *faults {
	t.Helper()
	f := &faults{t: t}
	f.drive(ws, func(w *worker, ev event) {
		switch {
		case ev.Ev != "holding":
		case f.victim == nil:
			f.kill(w, ev, fmt.Sprintf("holding slot %d", ev.Period))
		case f.sleeper == nil:
			f.stop(w, ev, fmt.Sprintf("holding slot %d", ev.Period))
		case !f.resumed && ev.Period == f.frozen.Period && ev.Fence > f.frozen.Fence:
			f.resume(fmt.Sprintf("%s holds slot %d (fence %d)", w.id, ev.Period, ev.Fence))
			w.send("go")
		default:
			w.send("go")
		}
	})
	return f
}

// roleSemaphore takes a slot of semaphore cfg.Name (semSlots slots)
// cfg.Periods times; each time it records the hold in cfg.Table with a
// fenced insert (start), reports "holding" and waits for the command "go",
// holds a moment, records its end with a fenced update, and releases. A
// rejected write (stale: the slot was lost) ends that round. Events: "holding" (period = slot, fence), "stale", "done".
func roleSemaphore(ctx context.Context, wk *workerSide) error {
	rctx := ctx // the role's, not the lease's: the frozen holder reads its answer after a loss
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
			// The test answers, or kills or stops this process here.
			if c, ok := wk.command(rctx); !ok || c != "go" {
				return fmt.Errorf("holding slot %d: want the command go, got %q (end of input: %v)", l.Slot(), c, !ok)
			}
			time.Sleep(30 * time.Millisecond) // hold a moment: the semaphore fills
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
