package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/benchsql"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

const benchLong = `Measure pgfence against the same work done with raw SQL, through the same
connection pool, on your database and network:

  lease TryAcquire+Release   leases.Client vs the minimal lease a user would write
                             by hand: a table and a sequence, one upsert to grant
                             and one UPDATE to release (see docs/performance.md)
  advisory TryLock+Unlock    pglock.Locker vs pg_try_advisory_lock/pg_advisory_unlock
                             on a connection taken from the pool
  fenced UPDATE              fencing.InTx on a protected table vs BEGIN; UPDATE;
                             COMMIT on an unprotected one; all goroutines write
                             under one lease's token, as writers under one
                             lease do

Each comparison runs for --duration per side at each --concurrency (each
goroutine uses its own lease, lock and row, so nothing contends; the fenced
writers share the lease's fence lock in shared mode), after a short
warm-up, alternating the two sides in 250ms slices so that changes in the
machine's load affect both alike. It prints operations per second, the
ratio pgfence/raw and the p50/p99 latency of one operation. It creates the
schema pgfence_bench (dropping any left by an interrupted run) and drops it
at the end, and releases every lease and lock it takes. It needs the
pgfence schema (pgfence migrate up). Run it where the production clients
run: the figures are mostly network round trips.`

// The raw baselines are the SQL a user would write by hand
// (internal/benchsql); the fenced table is the library's.
const (
	sqlBenchTryLock      = `SELECT pg_try_advisory_lock($1)`
	sqlBenchUnlock       = `SELECT pg_advisory_unlock($1)`
	sqlBenchFenced       = `CREATE TABLE pgfence_bench.fenced (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence bigint NOT NULL DEFAULT 0)`
	sqlBenchFillFenced   = `INSERT INTO pgfence_bench.fenced (id) SELECT generate_series(1, $1::int)`
	sqlBenchUpdateFenced = `UPDATE pgfence_bench.fenced SET v = v + 1 WHERE id = $1`
)

const maxBenchConcurrency = 256

func newBenchCmd(g *globals) *cobra.Command {
	var duration time.Duration
	var conc []int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure leases, advisory locks and fenced writes against raw SQL",
		Long:  benchLong,
		Args:  argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			if duration <= 0 {
				return usageErrorf("--duration must be positive, got %s", duration)
			}
			if len(conc) == 0 {
				return usageErrorf("--concurrency needs at least one value")
			}
			for _, c := range conc {
				if c < 1 || c > maxBenchConcurrency {
					return usageErrorf("--concurrency values must be between 1 and %d, got %d", maxBenchConcurrency, c)
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runBench(ctx, g, cmd.OutOrStdout(), duration, conc)
		}),
	}
	cmd.Flags().DurationVar(&duration, "duration", 5*time.Second, "how long each side of each comparison runs (> 0)")
	cmd.Flags().IntSliceVar(&conc, "concurrency", []int{1, 8}, fmt.Sprintf("goroutines per measurement, comma-separated (1..%d each)", maxBenchConcurrency))
	return cmd
}

// benchOp is one comparison: the pgfence call and its raw-SQL equivalent,
// each run by worker w on its own name or row.
type benchOp struct {
	name         string
	pgfence, raw func(ctx context.Context, w int) error
}

func runBench(ctx context.Context, g *globals, out io.Writer, d time.Duration, conc []int) error {
	maxConc := slices.Max(conc)
	pool, err := openSchemaPool(ctx, g.connString(), "pgfence bench", int32(maxConc+4))
	if err != nil {
		return err
	}
	defer pool.Close()
	lc, err := leases.New(pool)
	if err != nil {
		return fmt.Errorf("leases client: %w", err)
	}
	defer lc.Close()
	locker, err := pglock.New(pool)
	if err != nil {
		return err
	}
	// Fixed names: lease rows stay after release (they keep the fence
	// order), so a later run reuses them rather than adding more.
	const prefix = "pgfence-bench"

	tok, cleanup, err := benchSetup(ctx, pool, lc, prefix, maxConc)
	defer cleanup()
	if err != nil {
		return err
	}
	ops := benchOps(pool, lc, locker, prefix, tok)

	fmt.Fprintf(out, "pgfence bench: %s per side per row, concurrency %v\n\n", d, conc)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tCONCURRENCY\tPGFENCE OPS/S\tRAW OPS/S\tRATIO\tPGFENCE P50\tPGFENCE P99\tRAW P50\tRAW P99")
	for _, op := range ops {
		for _, c := range conc {
			warm := min(d/10, 200*time.Millisecond)
			if _, err := measure(ctx, warm, c, op.pgfence); err != nil {
				return fmt.Errorf("%s: pgfence: %w", op.name, err)
			}
			if _, err := measure(ctx, warm, c, op.raw); err != nil {
				return fmt.Errorf("%s: raw: %w", op.name, err)
			}
			p, r, err := compare(ctx, d, c, op)
			if err != nil {
				return err
			}
			ratio := "-"
			if r.rate() > 0 {
				ratio = fmt.Sprintf("%.2f", p.rate()/r.rate())
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\n", op.name, c, p.rate(), r.rate(), ratio,
				ms(p.quantile(0.50)), ms(p.quantile(0.99)), ms(r.quantile(0.50)), ms(r.quantile(0.99)))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	fmt.Fprintln(out, "\nRATIO is pgfence ops/s over raw ops/s (1.00 = no overhead); latencies are of one operation.")
	return nil
}

// benchSetup creates the schema pgfence_bench with a protected and a
// plain table of n rows, and takes the lease whose token the fenced
// updates carry. cleanup (always non-nil) releases it and drops the
// schema, even after ctx ends.
func benchSetup(ctx context.Context, pool *pgxpool.Pool, lc *leases.Client, prefix string, n int) (fencing.Token, func(), error) {
	var l *leases.Lease
	cleanup := func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if l != nil {
			_ = l.Release(cctx)
		}
		_, _ = pool.Exec(cctx, benchsql.DropSchema)
	}
	if _, err := pool.Exec(ctx, benchsql.DropSchema); err != nil {
		return fencing.Token{}, cleanup, fmt.Errorf("drop schema pgfence_bench left by an earlier run: %w", err)
	}
	if _, err := pool.Exec(ctx, benchsql.Schema+";"+sqlBenchFenced); err != nil {
		return fencing.Token{}, cleanup, fmt.Errorf("create schema pgfence_bench: %w", err)
	}
	if err := fencing.Protect(ctx, pool, "pgfence_bench.fenced"); err != nil {
		return fencing.Token{}, cleanup, fmt.Errorf("protect pgfence_bench.fenced: %w", err)
	}
	var err error
	if l, err = lc.TryAcquire(ctx, prefix+"/fenced", time.Minute); err != nil {
		return fencing.Token{}, cleanup, fmt.Errorf("acquire the lease for fenced updates: %w", err)
	}
	tok := l.Token()
	err = fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
		for _, fill := range []string{sqlBenchFillFenced, benchsql.FillPlain} {
			if _, err := tx.Exec(ctx, fill, n); err != nil {
				return fmt.Errorf("fill the bench tables: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return fencing.Token{}, cleanup, err
	}
	return tok, cleanup, nil
}

func benchOps(pool *pgxpool.Pool, lc *leases.Client, locker *pglock.Locker, prefix string, tok fencing.Token) []benchOp {
	name := func(kind string, w int) string { return fmt.Sprintf("%s/%s/%d", prefix, kind, w) }
	return []benchOp{
		{
			name: "lease TryAcquire+Release",
			pgfence: func(ctx context.Context, w int) error {
				l, err := lc.TryAcquire(ctx, name("lease", w), time.Minute)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			},
			raw: func(ctx context.Context, w int) error {
				n, owner := name("raw-lease", w), fmt.Sprintf("%s/raw-owner/%d", prefix, w)
				var fence int64
				if err := pool.QueryRow(ctx, benchsql.Grant, n, owner, time.Minute.Milliseconds()).Scan(&fence); err != nil {
					return fmt.Errorf("raw grant %q: %w", n, err)
				}
				if _, err := pool.Exec(ctx, benchsql.Release, n, fence); err != nil {
					return fmt.Errorf("raw release %q: %w", n, err)
				}
				return nil
			},
		},
		{
			name: "advisory TryLock+Unlock",
			pgfence: func(ctx context.Context, w int) error {
				lk, err := locker.TryLock(ctx, name("lock", w))
				if err != nil {
					return err
				}
				return lk.Unlock(ctx)
			},
			raw: func(ctx context.Context, w int) error {
				return rawTryLockUnlock(ctx, pool, pglock.Key(name("raw-lock", w)))
			},
		},
		{
			name: "fenced UPDATE",
			pgfence: func(ctx context.Context, w int) error {
				return fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, sqlBenchUpdateFenced, w+1)
					return err
				})
			},
			raw: func(ctx context.Context, w int) error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, benchsql.UpdatePlain, w+1)
					return err
				})
			},
		},
	}
}

// rawTryLockUnlock takes and frees an advisory lock by hand on one pooled
// connection.
func rawTryLockUnlock(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, sqlBenchTryLock, key).Scan(&ok); err != nil {
		_ = conn.Conn().Close(context.WithoutCancel(ctx)) // lock state in doubt
		conn.Release()
		return fmt.Errorf("pg_try_advisory_lock: %w", err)
	}
	if !ok {
		conn.Release()
		return errors.New("raw advisory lock held by another session")
	}
	err = conn.QueryRow(ctx, sqlBenchUnlock, key).Scan(&ok)
	if err != nil || !ok {
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return fmt.Errorf("pg_advisory_unlock (released %v): %w", ok, err)
	}
	conn.Release()
	return nil
}

// benchSlice is how long one side runs before the other takes its turn.
// Alternating in short slices (pgfence, raw, raw, pgfence, ...) spreads any
// drift in the machine's load — other processes, autovacuum — over both
// sides alike.
const benchSlice = 250 * time.Millisecond

// compare runs op's two sides for d each at concurrency c, in alternating
// slices, and returns their accumulated results.
func compare(ctx context.Context, d time.Duration, c int, op benchOp) (p, r benchResult, err error) {
	for i := 0; p.elapsed < d; i++ {
		s := min(benchSlice, d-p.elapsed)
		sides := []*benchResult{&p, &r}
		fns := []func(context.Context, int) error{op.pgfence, op.raw}
		if i%2 == 1 {
			slices.Reverse(sides)
			slices.Reverse(fns)
		}
		for k := range sides {
			got, err := measure(ctx, s, c, fns[k])
			if err != nil {
				side := "pgfence"
				if sides[k] == &r {
					side = "raw"
				}
				return p, r, fmt.Errorf("%s: %s: %w", op.name, side, err)
			}
			sides[k].add(got)
		}
	}
	slices.Sort(p.lat)
	slices.Sort(r.lat)
	return p, r, nil
}

// benchResult is one side of one measurement.
type benchResult struct {
	ops     int
	elapsed time.Duration
	lat     []time.Duration // sorted once complete
}

func (r *benchResult) add(o benchResult) {
	r.ops += o.ops
	r.elapsed += o.elapsed
	r.lat = append(r.lat, o.lat...)
}

func (r benchResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

func (r benchResult) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(int(q*float64(len(r.lat))), len(r.lat)-1)]
}

// opGrace is how long an operation in flight may take to finish after the
// measurement is stopped (an interrupt, another worker's error) before its
// own context ends too.
const opGrace = 5 * time.Second

// measure runs op on conc goroutines (worker numbers 0..conc-1) for d and
// returns the operations done and their latencies. The first error stops
// the measurement and is returned. When ctx ends or a worker fails, each
// worker stops after the operation it is in, which gets opGrace to finish:
// cancelling it half-way could leave a lease granted but never released
// (its grant's reply lost, or the release cut off), and the names are the
// same each run, so the next run would find it held until it expired.
func measure(ctx context.Context, d time.Duration, conc int, op func(ctx context.Context, w int) error) (benchResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	opCtx, opCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer opCancel()
	lats := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	workersDone := make(chan struct{})
	wg.Go(func() { // ends the operations in flight opGrace after ctx
		select {
		case <-workersDone:
		case <-ctx.Done():
			t := time.NewTimer(opGrace)
			defer t.Stop()
			select {
			case <-workersDone:
			case <-t.C:
				opCancel()
			}
		}
	})
	var workers sync.WaitGroup
	begin := time.Now()
	end := begin.Add(d)
	for w := range conc {
		workers.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				if t0.After(end) {
					return
				}
				if err := op(opCtx, w); err != nil {
					cancel(err)
					return
				}
				lats[w] = append(lats[w], time.Since(t0))
			}
		})
	}
	workers.Wait()
	close(workersDone)
	wg.Wait()
	elapsed := time.Since(begin)
	if err := context.Cause(ctx); err != nil {
		return benchResult{}, err
	}
	r := benchResult{elapsed: elapsed, lat: slices.Concat(lats...)}
	r.ops = len(r.lat)
	return r, nil
}

// ms formats d in milliseconds with microsecond precision.
func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond)) }
