package integration_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// registerModel is stepRegister as a porcupine model.
var registerModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{regState{}} },
	Step: stepRegister,
	DescribeOperation: func(input, output any) string {
		in, out := input.(opRecord), output.(opRecord)
		return fmt.Sprintf("%s(fence %d, value %d) -> %s (fence %d, value %d)", in.Kind, in.Fence, in.Value, out.Out, out.OutFence, out.OutValue)
	},
	DescribeState: func(s any) string { return s.(regState).String() },
}).ToModel()

// TestLinearizabilityModel shows on hand-written histories that the model
// accepts what pgfence promises and rejects what it forbids, without a
// database.
func TestLinearizabilityModel(t *testing.T) {
	t.Parallel()
	op := func(client int, call, ret int64, in opRecord, out opRecord) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	grant := func(c int, call, ret, fence int64) porcupine.Operation {
		return op(c, call, ret, opRecord{Kind: "grant"}, opRecord{Out: "ok", OutFence: fence})
	}
	write := func(c int, call, ret, fence, value int64, outcome string) porcupine.Operation {
		return op(c, call, ret, opRecord{Kind: "write", Fence: fence, Value: value}, opRecord{Out: outcome})
	}
	read := func(c int, call, ret, fence, value int64) porcupine.Operation {
		return op(c, call, ret, opRecord{Kind: "read"}, opRecord{Out: "ok", OutFence: fence, OutValue: value})
	}
	cases := []struct {
		name    string
		history []porcupine.Operation
		want    porcupine.CheckResult
	}{
		{"takeover", []porcupine.Operation{
			grant(0, 0, 1, 5), write(0, 2, 3, 5, 50, "ok"),
			grant(1, 4, 5, 6), write(1, 6, 7, 6, 60, "ok"),
			write(0, 8, 9, 5, 51, "stale"), read(2, 10, 11, 6, 60),
		}, porcupine.Ok},
		{"concurrent write may land either side of a read", []porcupine.Operation{
			grant(0, 0, 1, 5), write(0, 2, 10, 5, 50, "ok"), read(1, 3, 4, 0, 0), read(1, 11, 12, 5, 50),
		}, porcupine.Ok},
		{"unknown write may have happened", []porcupine.Operation{
			grant(0, 0, 1, 5), write(0, 2, 3, 5, 50, "unknown"), read(1, 4, 5, 5, 50),
		}, porcupine.Ok},
		{"stale write accepted", []porcupine.Operation{
			grant(0, 0, 1, 5), grant(1, 2, 3, 6), write(1, 4, 5, 6, 60, "ok"), write(0, 6, 7, 5, 51, "ok"),
		}, porcupine.Illegal},
		{"fence did not increase", []porcupine.Operation{
			grant(0, 0, 1, 6), grant(1, 2, 3, 6),
		}, porcupine.Illegal},
		{"write after release", []porcupine.Operation{
			grant(0, 0, 1, 5), op(0, 2, 3, opRecord{Kind: "release", Fence: 5}, opRecord{Out: "ok"}), write(0, 4, 5, 5, 50, "ok"),
		}, porcupine.Illegal},
		{"lost write", []porcupine.Operation{
			grant(0, 0, 1, 5), write(0, 2, 3, 5, 50, "ok"), read(1, 4, 5, 0, 0),
		}, porcupine.Illegal},
	}
	for _, c := range cases {
		if got := porcupine.CheckOperationsTimeout(registerModel, c.history, 10*time.Second); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// TestLinearizability records histories of four worker processes that take
// a lease (TTL 1s) and read and write a register row protected by the fence
// guard, each through a proxy of its own, while the test attacks them: a
// holder is SIGSTOPped until another has taken over and written, then made
// to write with its old token; one worker's network is blackholed then
// cut; one is paused past its TTL; one is SIGKILLed. porcupine checks the
// history against the model (stepRegister).
//
// Guarded proves the history linearizable. Bypass runs the same attack with
// the guard trigger dropped from the table — the fence is then only a
// column the writer fills in — and asserts that the checker reports the
// history Illegal: the test can fail.
func TestLinearizability(t *testing.T) {
	t.Parallel()
	t.Run("Guarded", func(t *testing.T) {
		t.Parallel()
		if res := checkLinearizable(t, false); res != porcupine.Ok {
			t.Errorf("history with the fence guard: %s, want Ok", res)
		}
	})
	t.Run("Bypass", func(t *testing.T) {
		t.Parallel()
		if res := checkLinearizable(t, true); res != porcupine.Illegal {
			t.Errorf("history without the fence guard: %s, want Illegal", res)
		}
	})
}

func checkLinearizable(t *testing.T, bypass bool) porcupine.CheckResult {
	const workers, maxOps, ttl = 4, 200, time.Second
	u := setup(t)
	pool := newPool(t, u, "parent")
	// A worker stopped inside a fenced transaction holds the lease's fence
	// lock, which blocks every takeover until the transaction ends: let
	// the server end it.
	mustExec(t, pool, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idle_in_transaction_session_timeout = %L', current_database(), '1s'); END $$`)
	protectedTable(t, pool, "reg", "id int PRIMARY KEY, value bigint NOT NULL")
	if bypass {
		mustExec(t, pool, "DROP TRIGGER pgfence_guard ON reg")
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	ws := make([]*worker, workers)
	proxies := make([]*proxy, workers)
	for i := range ws {
		proxies[i] = startProxy(t, hostPort(t, u))
		ws[i] = startWorker(t, workerConfig{Role: "linear", ID: fmt.Sprintf("c%d", i), URL: proxies[i].URL(t, u),
			Name: "reg", TTL: ttl, Table: "reg", Periods: maxOps})
	}
	ctx := ctxT(t, 2*time.Minute)

	// 1. The orchestrated stale writer: stop the holder, wait until
	// someone else has been granted the lease and written, then make the
	// old holder write with its old token as it resumes. The holder is
	// chosen once its grant has been renewed (so its TryAcquire returned
	// long ago and its last grant is the one in the row), and confirmed
	// after the stop.
	var holder int
	var fence int64
	for {
		var row leaseRow
		mustWait(t, 30*time.Second, "a holder whose grant has been renewed", func() (bool, error) {
			r, ok, err := readLease(ctx, pool, "reg")
			if err != nil || !ok || !r.live() || !r.RenewedAt.After(r.AcquiredAt) {
				return false, err
			}
			row = r
			_, err = fmt.Sscanf(r.Owner, "c%d-", &holder)
			return err == nil, err
		})
		ws[holder].kill(syscall.SIGSTOP)
		again, ok, err := readLease(ctx, pool, "reg")
		if err != nil {
			t.Fatal(err)
		}
		if ok && again.Owner == row.Owner && again.Fence == row.Fence {
			fence = row.Fence
			break
		}
		ws[holder].kill(syscall.SIGCONT) // it moved on before the stop: choose again
	}
	mustWait(t, 30*time.Second, "another worker to take over and write", func() (bool, error) {
		var f int64
		err := pool.QueryRow(ctx, "SELECT coalesce(max(fence), 0) FROM reg").Scan(&f)
		return f > fence, err
	})
	ws[holder].send(fmt.Sprintf("write %d", fence))
	ws[holder].kill(syscall.SIGCONT)
	t.Logf("stopped holder c%d (fence %d) until another wrote; then it wrote with its old token", holder, fence)

	// 2. Random faults on the others.
	others := rng.Perm(workers)
	var victims []int
	for _, i := range others {
		if i != holder {
			victims = append(victims, i)
		}
	}
	partitioned, paused, killed := victims[0], victims[1], victims[2]
	proxies[partitioned].Blackhole()
	ws[paused].kill(syscall.SIGSTOP)
	time.Sleep(ttl + time.Duration(rng.IntN(500))*time.Millisecond) // the fault's duration: past the TTL
	ws[paused].kill(syscall.SIGCONT)
	proxies[partitioned].Cut()
	proxies[partitioned].Heal()
	time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // a random moment of its work
	ws[killed].kill(syscall.SIGKILL)
	t.Logf("blackholed then cut c%d, paused c%d past its TTL, SIGKILLed c%d", partitioned, paused, killed)
	time.Sleep(time.Second) // let the survivors work after the faults (the history's tail)

	// 3. Collect the history.
	var history []porcupine.Operation
	var staleWrite *opRecord
	for i, w := range ws {
		if i != killed {
			w.send("stop")
			w.await("done", time.Minute)
			w.finish(30 * time.Second)
		} else {
			_ = w.exitErr()
			w.finish(10 * time.Second)
		}
		ops := linearOps(i, w.seen)
		history = append(history, ops...)
		for _, op := range ops {
			in, out := op.Input.(opRecord), op.Output.(opRecord)
			if i == holder && in.Forced && op.Return != math.MaxInt64 {
				staleWrite = &out // the write commanded as it resumed
			}
		}
	}
	counts := map[string]int{}
	for _, op := range history {
		counts[op.Input.(opRecord).Kind+"/"+op.Output.(opRecord).Out]++
	}
	if staleWrite == nil {
		t.Errorf("the resumed holder c%d made no write", holder)
	} else {
		t.Logf("the resumed holder's write with fence %d: %s", staleWrite.Fence, staleWrite.Out)
		if want := map[bool]string{false: "stale", true: "ok"}[bypass]; staleWrite.Out != want || staleWrite.Fence != fence {
			t.Errorf("the resumed holder's write with fence %d: %s, want %s with its old fence %d", staleWrite.Fence, staleWrite.Out, want, fence)
		}
	}
	start := time.Now()
	res := porcupine.CheckOperationsTimeout(registerModel, history, time.Minute)
	t.Logf("%d operations (%s): porcupine says %s in %v", len(history), describeCounts(counts), res, time.Since(start).Round(time.Millisecond))
	return res
}

func describeCounts(counts map[string]int) string {
	var parts []string
	for _, k := range []string{"grant/ok", "write/ok", "write/stale", "read/ok", "renew/ok", "renew/lost", "release/ok", "release/lost"} {
		parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
	}
	unknown := 0
	for k, n := range counts {
		if strings.HasSuffix(k, "/unknown") {
			unknown += n
		}
	}
	return strings.Join(append(parts, fmt.Sprintf("unknown %d", unknown)), ", ")
}

// linearOps turns one linearizability worker's events into porcupine
// operations; an operation whose "ret" never came (the worker died) has an
// unknown outcome and no return.
func linearOps(client int, seen []event) []porcupine.Operation {
	var ops []porcupine.Operation
	calls := map[int]opRecord{}
	for _, ev := range seen {
		switch ev.Ev {
		case "call":
			calls[ev.Op.Seq] = *ev.Op
		case "ret":
			in := calls[ev.Op.Seq]
			delete(calls, ev.Op.Seq)
			ops = append(ops, porcupine.Operation{ClientId: client, Input: in, Call: in.Call, Output: *ev.Op, Return: ev.Op.Ret})
		}
	}
	for _, in := range calls {
		ops = append(ops, porcupine.Operation{ClientId: client, Input: in, Call: in.Call,
			Output: opRecord{Out: "unknown"}, Return: math.MaxInt64})
	}
	return ops
}
