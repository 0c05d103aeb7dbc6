package integration_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/leases"
)

func init() { workerRoles["once"] = roleOnce }

// TestOncePerPeriod is the seed's scenario with the library's Once: five
// worker processes run the same 15 periods of a job with leases.OnceTx,
// writing each period's effect in the transaction that records it. Each
// worker waits inside every period (lease held, transaction open) for the
// test to let it go on; the test SIGKILLs the first worker there in a
// period at or after 3 and SIGSTOPs the first in one at or after 6, and
// lets the frozen one go on once the others have run two more periods.
// Each period's effect happens exactly once, written by the worker that
// reported running it, and its fence exceeds the previous period's.
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
	f := drivePeriods(t, ws, periods)
	victim, killed, sleeper, frozen := f.victim, f.killed, f.sleeper, f.frozen
	if t.Failed() {
		return
	}
	for _, w := range ws {
		if w != victim {
			w.finish(30 * time.Second)
		}
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
	// What the workers report agrees with the table: every event was read,
	// and neither the killed nor the frozen worker got past its "running".
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
		if w := ran[e.Period]; w != e.Worker {
			t.Errorf("period %d was written by %s, reported run by %q", e.Period, e.Worker, w)
		}
	}
	if w := ran[killed.Period]; w == victim.id {
		t.Errorf("period %d reported run by %s, killed inside it", killed.Period, w)
	}
	if w := ran[frozen.Period]; w == sleeper.id {
		t.Errorf("period %d reported run by %s, frozen inside it until its session was ended", frozen.Period, w)
	}
	t.Logf("%d workers × %d periods in %v, one killed, one frozen", workers, periods, elapsed.Round(time.Millisecond))
}

// drivePeriods answers the "running" events of the once workers ws until
// each of them but the killed one reports "done". The first worker inside
// a period at or after 3 is SIGKILLed and the first inside one at or after
// 6 SIGSTOPped while they wait for their answer (inside the period, its
// transaction open); the frozen one is resumed, and let go on, once
// another has run the period two after its own (or the last).
func drivePeriods(t *testing.T, ws []*worker, periods int) *faults {
	t.Helper()
	f := &faults{t: t}
	f.drive(ws, func(w *worker, ev event) {
		switch {
		case ev.Ev == "ran" && f.sleeper != nil && !f.resumed && ev.Period >= min(f.frozen.Period+2, periods):
			f.resume(fmt.Sprintf("%s ran period %d", w.id, ev.Period))
		case ev.Ev != "running":
		case f.victim == nil && ev.Period >= 3:
			f.kill(w, ev, fmt.Sprintf("inside period %d", ev.Period))
		case f.victim != nil && f.sleeper == nil && ev.Period >= 6:
			f.stop(w, ev, fmt.Sprintf("inside period %d", ev.Period))
		default:
			w.send("go")
		}
	})
	return f
}

// roleOnce runs periods 1..cfg.Periods of job cfg.Name with OnceTx,
// inserting the period's row into cfg.Table in the recording transaction.
// Its sessions end transactions left idle for 2s, so that a frozen holder
// cannot block the lease for ever. Events: "running" (period, fence)
// inside the transaction, after which it waits for the command "go", then
// "ran" or "skipped" (period), and "done".
func roleOnce(ctx context.Context, wk *workerSide) error {
	rctx := ctx // the role's, not the lease's: the frozen holder reads its answer after a loss
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
			// The test answers, or kills or stops this process here.
			if c, ok := wk.command(rctx); !ok || c != "go" {
				return fmt.Errorf("inside period %d: want the command go, got %q (end of input: %v)", p, c, !ok)
			}
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
