package integration_test

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
)

func init() { workerRoles["once"] = roleOnce }

// TestOncePerPeriod is the seed's scenario with the library's Once: five
// worker processes run the same 15 periods of a job with leases.OnceTx,
// writing each period's effect in the transaction that records it. One
// worker is SIGKILLed and another SIGSTOPped while each is inside a
// period (lease held, transaction open); the frozen one is let go later,
// when the others have moved on. Each period's effect happens exactly
// once, and its fence exceeds the previous period's.
//
// A frozen holder's open transaction holds the lease's fence lock, which
// no new grant can pass; the workers' sessions set
// idle_in_transaction_session_timeout (2s), so the server ends it and the
// others carry on (see docs/primitives.md).
func TestOncePerPeriod(t *testing.T) {
	t.Parallel()
	const workers, periods = 5, 15
	u := setup(t)
	pool := newPool(t, u, "parent")
	protectedTable(t, pool, "effects", "id bigserial PRIMARY KEY, period int NOT NULL, worker text NOT NULL")

	start := time.Now()
	ws := make([]*worker, workers)
	for i := range ws {
		ws[i] = startWorker(t, workerConfig{Role: "once", ID: fmt.Sprintf("w%d", i), URL: u,
			Name: "billing/nightly", TTL: time.Second, Periods: periods, Table: "effects"})
	}
	// Whoever is first inside a period at or after 3 dies; whoever is next
	// inside one at or after 6 freezes.
	victim, killed := firstInside(t, ws, 3)
	victim.kill(syscall.SIGKILL)
	_ = victim.exitErr()
	t.Logf("SIGKILLed %s inside period %d (fence %d)", victim.id, killed.Period, killed.Fence)
	var alive []*worker
	for _, w := range ws {
		if w != victim {
			alive = append(alive, w)
		}
	}
	sleeper, frozen := firstInside(t, alive, 6)
	sleeper.kill(syscall.SIGSTOP)
	t.Logf("SIGSTOPped %s inside period %d (fence %d)", sleeper.id, frozen.Period, frozen.Fence)
	// The others get past the frozen one's period, then it resumes.
	next := min(frozen.Period+2, periods)
	mustWait(t, 2*time.Minute, fmt.Sprintf("period %d done", next), func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE period = $1`, next).Scan(&n)
		return n > 0, err
	})
	sleeper.kill(syscall.SIGCONT)

	awaitDone(alive)
	if t.Failed() {
		return
	}
	elapsed := time.Since(start)

	ctx := ctxT(t, 30*time.Second)
	effects := checkEffects(ctx, t, pool, periods)
	// The records agree with the effects.
	var recs int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.once o JOIN effects e
		ON o.name = 'billing/nightly' AND o.period = e.period::text AND o.fence = e.fence`).Scan(&recs); err != nil {
		t.Fatal(err)
	}
	if recs != periods {
		t.Errorf("%d records match an effect's period and fence, want %d", recs, periods)
	}
	// What the workers report agrees with the table.
	ran := map[int]string{}
	for _, w := range ws {
		for _, ev := range w.seen {
			if ev.Ev != "ran" {
				continue
			}
			if prev, dup := ran[ev.Period]; dup {
				t.Errorf("period %d reported run by %s and by %s", ev.Period, prev, ev.Worker)
			}
			ran[ev.Period] = ev.Worker
		}
	}
	for _, e := range effects {
		if w, ok := ran[e.Period]; ok && w != e.Worker || !ok && e.Worker != victim.id {
			t.Errorf("period %d was written by %s, reported run by %q", e.Period, e.Worker, w)
		}
	}
	t.Logf("%d workers × %d periods in %v, one killed, one frozen", workers, periods, elapsed.Round(time.Millisecond))
}

// awaitDone waits, for each worker of ws in parallel, for its "done"
// event, and then for it to exit.
func awaitDone(ws []*worker) {
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.await("done", 3*time.Minute)
			w.finish(30 * time.Second)
		}()
	}
	wg.Wait()
}

// firstInside returns the first of ws to report "running" for a period
// at or after from, with that event.
func firstInside(t *testing.T, ws []*worker, from int) (*worker, event) {
	t.Helper()
	return firstMatch(t, ws, func(e event) bool { return e.Ev == "running" && e.Period >= from })
}

// firstMatch reads the events of ws as they come and returns the first
// worker to report an event that match accepts, with that event. Events
// read are kept in each worker's seen.
func firstMatch(t *testing.T, ws []*worker, match func(event) bool) (*worker, event) {
	t.Helper()
	timeout := time.After(2 * time.Minute)
	for {
		i, ev := nextEvent(t, ws, timeout, "no worker reported the awaited event within 2m")
		if match(ev) {
			return ws[i], ev
		}
	}
}

// nextEvent returns the next event of any worker of ws, with the worker's
// index, and keeps it in that worker's seen. It fails the test with
// expired once timeout fires, when a worker exits, and on an "error" event.
func nextEvent(t *testing.T, ws []*worker, timeout <-chan time.Time, expired string) (int, event) {
	t.Helper()
	cases := make([]reflect.SelectCase, len(ws)+1)
	for i, w := range ws {
		cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.events)}
	}
	cases[len(ws)] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timeout)}
	i, v, ok := reflect.Select(cases)
	if i == len(ws) {
		t.Fatal(expired)
	}
	if !ok {
		t.Fatalf("worker %s exited: %v\n%s", ws[i].id, ws[i].exitErr(), ws[i].log())
	}
	ev := v.Interface().(event)
	ws[i].seen = append(ws[i].seen, ev)
	if ev.Ev == "error" {
		t.Fatalf("worker %s failed: %s", ws[i].id, ev.Err)
	}
	return i, ev
}

// roleOnce runs periods 1..cfg.Periods of job cfg.Name with OnceTx,
// inserting the period's row into cfg.Table in the recording transaction.
// Its sessions end transactions left idle for 2s, so that a frozen holder
// cannot block the lease for ever. Events: "running" (period, fence)
// inside the transaction, then "ran" or "skipped" (period), and "done".
func roleOnce(ctx context.Context, wk *workerSide) error {
	cfg := wk.cfg
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return err
	}
	q := u.Query()
	q.Set("options", "-c idle_in_transaction_session_timeout=2s")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // libpq reads + literally
	wk.cfg.URL = u.String()
	_, client, closeAll, err := workerLeases(ctx, wk)
	if err != nil {
		return err
	}
	defer closeAll()
	table := pgx.Identifier{cfg.Table}.Sanitize()
	for p := 1; p <= cfg.Periods; p++ {
		ran, err := client.OnceTx(ctx, cfg.Name, fmt.Sprint(p), cfg.TTL, func(ctx context.Context, tx pgx.Tx, l *leases.Lease) error {
			wk.emit(event{Ev: "running", Period: p, Fence: l.Fence()})
			time.Sleep(20 * time.Millisecond) // stay inside a moment: a signal lands mid-period
			_, err := tx.Exec(ctx, "INSERT INTO "+table+" (period, worker) VALUES ($1, $2)", p, cfg.ID)
			return err
		})
		if err != nil {
			return fmt.Errorf("period %d: %w", p, err)
		}
		ev := "skipped"
		if ran {
			ev = "ran"
		}
		wk.emit(event{Ev: ev, Period: p})
	}
	wk.emit(event{Ev: "done"})
	return nil
}
