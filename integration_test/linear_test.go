package integration_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

// opRecord is one operation of a linearizability worker, as it reports it:
// a "call" event before the operation (Out empty) and a "ret" event after
// it. An operation whose "ret" never comes (the worker was killed) has an
// unknown outcome that may have taken effect at any time after its call.
type opRecord struct {
	Seq   int    `json:"seq"`
	Kind  string `json:"kind"`            // grant, renew, release, write, read
	Fence int64  `json:"fence,omitempty"` // the token's fence (renew, release, write)
	Value int64  `json:"value,omitempty"` // the value written (write)
	Call  int64  `json:"call"`            // UnixNano before the operation
	Ret   int64  `json:"ret,omitempty"`   // UnixNano after it
	// Outcome: "ok"; "held" (grant: someone else holds it); "stale" (write
	// rejected by the guard); "lost" (renew, release: the grant is gone);
	// "unknown" (an error that does not say whether it took effect).
	Out      string `json:"out,omitempty"`
	OutFence int64  `json:"out_fence,omitempty"` // grant: the fence; read: the row's fence
	OutValue int64  `json:"out_value,omitempty"` // read: the row's value
	// Forced: a write the parent commanded ("write FENCE"), not one of the
	// worker's own.
	Forced bool `json:"forced,omitempty"`
}

// roleLinear performs random operations on lease cfg.Name and row 1 of the
// register table cfg.Table, reporting each as a call and a ret event, until
// the parent sends "stop" (or closes stdin) or cfg.Periods operations are
// recorded. The command "write FENCE" makes its next operation a write with
// the token of its grant with that fence, whether or not it still holds it
// (a holder that paused between its check and its write), recorded as
// Forced: the parent finds it by that, not by when it came, as the worker
// may finish other operations first.
func roleLinear(ctx context.Context, wk *workerSide) error {
	cfg := wk.cfg
	pool, client, closeAll, err := workerLeases(ctx, wk)
	if err != nil {
		return err
	}
	defer closeAll()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))
	table := pgx.Identifier{cfg.Table}.Sanitize()

	var cur *leases.Lease                // believed held
	granted := map[int64]fencing.Token{} // every grant's token, by fence
	seq := 0
	run := func(op opRecord, do func(ctx context.Context, op *opRecord)) {
		seq++
		op.Seq = seq
		op.Call = time.Now().UnixNano()
		wk.emit(event{Ev: "call", Op: &op})
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		do(octx, &op)
		cancel()
		op.Ret = time.Now().UnixNano()
		wk.emit(event{Ev: "ret", Op: &op})
	}
	write := func(tok fencing.Token, forced bool) {
		value := int64(rng.Uint32())<<8 | int64(seq&0xff) + 1
		run(opRecord{Kind: "write", Fence: tok.Fence, Value: value, Forced: forced}, func(ctx context.Context, op *opRecord) {
			err := fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id, value, fence) VALUES (1, $1, $2) "+
					"ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence", op.Value, op.Fence)
				return err
			})
			switch {
			case err == nil:
				op.Out = "ok"
			case fencing.IsStale(err):
				op.Out = "stale"
			default:
				op.Out = "unknown"
			}
		})
	}
	var forced *fencing.Token // a commanded write, next
	for seq < cfg.Periods {
		select {
		case c, ok := <-wk.cmds:
			if !ok || c == "stop" {
				wk.emit(event{Ev: "done"})
				return nil
			}
			var fence int64
			if _, err := fmt.Sscanf(c, "write %d", &fence); err != nil {
				return fmt.Errorf("command %q: want stop or write FENCE", c)
			}
			tok, ok := granted[fence]
			if !ok {
				return fmt.Errorf("command %q: this worker was never granted fence %d", c, fence)
			}
			forced = &tok
		default:
		}
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond) // pace: let clients interleave
		if cur != nil && cur.Err() != nil {
			cur = nil // noticed the loss: campaign again
		}
		switch dice := rng.IntN(100); {
		case forced != nil:
			write(*forced, true)
			forced = nil
		case cur == nil:
			// Only grants are recorded: a TryAcquire that finds the lease
			// held changes nothing, and one in flight when the worker dies
			// is, to the model, a grant that may not have happened.
			call := time.Now().UnixNano()
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := client.TryAcquire(octx, cfg.Name, cfg.TTL)
			cancel()
			if errors.Is(err, leases.ErrHeld) {
				time.Sleep(time.Duration(20+rng.IntN(40)) * time.Millisecond) // back off
				continue
			}
			seq++
			op := opRecord{Seq: seq, Kind: "grant", Call: call, Out: "unknown"}
			if err == nil {
				op.Out, op.OutFence = "ok", l.Fence()
				cur, granted[l.Fence()] = l, l.Token()
			}
			wk.emit(event{Ev: "call", Op: &op})
			op.Ret = time.Now().UnixNano()
			wk.emit(event{Ev: "ret", Op: &op})
		case dice < 45:
			write(cur.Token(), false)
		case dice < 75:
			run(opRecord{Kind: "read"}, func(ctx context.Context, op *opRecord) {
				err := pool.QueryRow(ctx, "SELECT value, fence FROM "+table+" WHERE id = 1").Scan(&op.OutValue, &op.OutFence)
				switch {
				case err == nil, errors.Is(err, pgx.ErrNoRows):
					op.Out = "ok"
				default:
					op.Out = "unknown"
				}
			})
		case dice < 88:
			l := cur
			run(opRecord{Kind: "renew", Fence: l.Fence()}, func(ctx context.Context, op *opRecord) {
				op.Out = leaseOutcome(l.Renew(ctx))
			})
		default:
			l := cur
			cur = nil
			run(opRecord{Kind: "release", Fence: l.Fence()}, func(ctx context.Context, op *opRecord) {
				op.Out = leaseOutcome(l.Release(ctx))
			})
		}
	}
	wk.emit(event{Ev: "done"})
	return nil
}

// leaseOutcome classifies Renew's and Release's results.
func leaseOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, leases.ErrLost):
		return "lost"
	}
	return "unknown"
}

// regState is the model's state: the highest fence granted (the current
// grant), whether that grant may still be live, and the register row.
type regState struct {
	Granted  int64
	Live     bool
	RowFence int64
	Value    int64
}

func (s regState) String() string {
	return fmt.Sprintf("{granted %d live %v row fence %d value %d}", s.Granted, s.Live, s.RowFence, s.Value)
}

// stepRegister is the sequential specification of a lease and a register
// protected by the fence guard. Expiry is invisible to clients, so the model
// allows anything that an expiry could explain (a new grant at any time, a
// rejected write or renewal of the current grant), and forbids what no
// expiry can: a grant whose fence does not exceed every earlier one
// (guarantee 2), an accepted write or renewal by a grant that is not the
// current one, or after it was released or found lost (guarantees 1 and
// 3), an accepted write with a fence below the row's, and a read that does
// not return the last accepted write. An operation with an unknown outcome
// may or may not have taken effect.
func stepRegister(state, input, output any) []any {
	s := state.(regState)
	op := input.(opRecord)
	out := output.(opRecord)
	current := op.Fence == s.Granted
	switch op.Kind {
	case "grant":
		if out.Out != "ok" {
			return []any{s} // held changes nothing; unknown: see stepRegister's doc
		}
		if out.OutFence <= s.Granted {
			return nil
		}
		return []any{regState{Granted: out.OutFence, Live: true, RowFence: s.RowFence, Value: s.Value}}
	case "renew", "release":
		ended := s
		if current {
			ended.Live = false
		}
		switch out.Out {
		case "ok":
			if !current || !s.Live {
				return nil
			}
			if op.Kind == "release" {
				return []any{ended}
			}
			return []any{s}
		}
		// lost may be the holder's local judgement (its deadline passed)
		// while the server's grant still runs for a moment: both states
		// are possible, as for unknown.
		return []any{s, ended}
	case "write":
		applied := regState{Granted: s.Granted, Live: s.Live, RowFence: op.Fence, Value: op.Value}
		legal := current && s.Live && op.Fence >= s.RowFence
		switch out.Out {
		case "ok":
			if !legal {
				return nil
			}
			return []any{applied}
		case "stale":
			if current {
				s.Live = false // only an expiry explains it
			}
			return []any{s}
		}
		if legal {
			return []any{s, applied}
		}
		return []any{s}
	case "read":
		if out.Out != "ok" {
			return []any{s}
		}
		if out.OutValue != s.Value || out.OutFence != s.RowFence {
			return nil
		}
		return []any{s}
	}
	return nil
}
