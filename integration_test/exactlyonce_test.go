package integration_test

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestExactlyOnce runs a cron-like job on five worker processes: for each
// of 20 periods every worker takes the lease "cron" (TTL 1s) and, in a
// fenced transaction on the protected table effects, writes the period's
// row unless one exists. The table has no unique key on period: only the
// lease and the fence guard stand between the workers and a duplicate. It
// proves that each period's side effect happens exactly once — also when a
// worker is SIGKILLed while it holds the lease (the others wait for the TTL
// and carry on) — and that the fences stamped on the rows increase with the
// periods.
func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	t.Run("AllWorkers", func(t *testing.T) { t.Parallel(); testExactlyOnce(t, false) })
	t.Run("OneKilled", func(t *testing.T) { t.Parallel(); testExactlyOnce(t, true) })
}

func testExactlyOnce(t *testing.T, kill bool) {
	const workers, periods, killAt = 5, 20, 5
	u := setup(t)
	pool := newPool(t, u, "parent")
	protectedTable(t, pool, "effects", "id bigserial PRIMARY KEY, period int NOT NULL, worker text NOT NULL")

	start := time.Now()
	ws := make([]*worker, workers)
	for i := range ws {
		ws[i] = startWorker(t, workerConfig{Role: "periods", ID: fmt.Sprintf("w%d", i), URL: u,
			Name: "cron", TTL: time.Second, Periods: periods, Table: "effects"})
	}
	killedAt := -1
	if kill {
		// Kill w0 the moment it reports holding the lease for a period
		// at or after killAt: it dies holding the lease, maybe mid-write.
		for {
			ev := ws[0].next(2 * time.Minute)
			if ev.Ev == "acquired" && ev.Period >= killAt {
				ws[0].kill(syscall.SIGKILL)
				killedAt = ev.Period
				break
			}
		}
		_ = ws[0].exitErr()
		t.Logf("SIGKILLed w0 holding the lease for period %d (fence %d)", killedAt, ws[0].seen[len(ws[0].seen)-1].Fence)
	}
	var wg sync.WaitGroup
	for i, w := range ws {
		if kill && i == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.await("done", 2*time.Minute)
			w.finish(30 * time.Second)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	elapsed := time.Since(start)

	ctx := ctxT(t, 30*time.Second)
	effects := checkEffects(ctx, t, pool, periods)
	if len(effects) != periods {
		t.Errorf("%d effects for %d periods: %+v", len(effects), periods, effects)
	}

	// What the workers report agrees with the table.
	reported := map[int]effect{}
	grants, retries := 0, 0
	for _, w := range ws {
		for _, ev := range w.seen {
			switch ev.Ev {
			case "acquired":
				grants++
			case "retry":
				retries++
				t.Logf("%s retried period %d: %s", ev.Worker, ev.Period, ev.Err)
			case "wrote":
				if prev, dup := reported[ev.Period]; dup {
					t.Errorf("period %d reported written by %s and by %s", ev.Period, prev.Worker, ev.Worker)
				}
				reported[ev.Period] = effect{Period: ev.Period, Worker: ev.Worker, Fence: ev.Fence}
			}
		}
	}
	for _, e := range effects {
		r, ok := reported[e.Period]
		switch {
		case !ok && !(kill && e.Worker == "w0"): // w0 may have committed just before dying
			t.Errorf("period %d was written by %s but no worker reported writing it", e.Period, e.Worker)
		case ok && r != e:
			t.Errorf("period %d: table says %+v, worker reported %+v", e.Period, e, r)
		}
	}
	t.Logf("%d workers × %d periods in %v: %d grants, %d retries", workers, periods, elapsed.Round(time.Millisecond), grants, retries)
}

// effect is a row of the effects table the period workers write.
type effect struct {
	Period int
	Worker string
	Fence  int64
}

// checkEffects reads the effects table, in period order, and checks that
// each of periods 1..periods happened exactly once and that each period's
// fence is above the one before.
func checkEffects(ctx context.Context, t *testing.T, pool *pgxpool.Pool, periods int) []effect {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT period, worker, fence FROM effects ORDER BY period, id`)
	if err != nil {
		t.Fatal(err)
	}
	effects, err := pgx.CollectRows(rows, pgx.RowToStructByPos[effect])
	if err != nil {
		t.Fatal(err)
	}
	count := map[int]int{}
	for _, e := range effects {
		count[e.Period]++
	}
	for p := 1; p <= periods; p++ {
		if count[p] != 1 {
			t.Errorf("period %d happened %d times, want exactly once", p, count[p])
		}
	}
	for i := 1; i < len(effects); i++ {
		if effects[i].Fence <= effects[i-1].Fence {
			t.Errorf("fence of period %d (%d) is not above that of period %d (%d)",
				effects[i].Period, effects[i].Fence, effects[i-1].Period, effects[i-1].Fence)
		}
	}
	return effects
}
