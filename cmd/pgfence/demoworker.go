package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/leases"
)

// demoEvent is a line a demo worker reports: JSON on stdout in supervised
// mode (read by the demo parent), text otherwise.
type demoEvent struct {
	Event  string `json:"event"` // started, acquired, skipped, ready, wrote, stale, lost, error, done
	Worker string `json:"worker"`
	Period int    `json:"period,omitempty"`
	Fence  int64  `json:"fence,omitempty"`
	// Retries counts the write's attempts that failed with a
	// serialization failure before the one reported (wrote, stale).
	Retries int    `json:"retries,omitempty"`
	Error   string `json:"error,omitempty"`
}

type workerOptions struct {
	name       string
	periods    int
	first      int
	ttl, work  time.Duration
	supervised bool
}

// demoWriteTimeout bounds a worker's fenced write, which a stop does not
// cut short; under the 10s that docker compose stop waits by default.
const demoWriteTimeout = 5 * time.Second

func demoLeaseName(period int) string { return "demo/period/" + strconv.Itoa(period) }

func newDemoWorkerCmd(g *globals) *cobra.Command {
	var o workerOptions
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "One demo worker (what 'pgfence demo' starts; usable on its own)",
		Long: `Run one demo worker: for each period, take lease demo/period/<n>, check that
the period is not done yet, work for --work, then write the period's row to
` + demoTable + ` through a fenced transaction. Several workers (for example the
docker-compose worker service) compete; each period is written exactly once,
and a worker that was paused past its TTL is rejected by the database.

It stops after --periods periods (0: until SIGINT/SIGTERM; a write in
flight is finished and reported first, within ` + demoWriteTimeout.String() + `). The schema
pgfence must be migrated; the demo table is created if missing.`,
		Hidden: true,
		Args:   argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			if err := validDemoTiming(o.ttl, o.work); err != nil {
				return err
			}
			// Periods are the demo table's int column.
			if o.periods < 0 || o.first < 0 || o.first+o.periods > math.MaxInt32 {
				return usageErrorf("--first and --periods must not be negative, and --first + --periods at most %d (periods are an int column), got --first %d --periods %d",
					math.MaxInt32, o.first, o.periods)
			}
			if o.name == "" {
				host, _ := os.Hostname()
				o.name = fmt.Sprintf("%s/%d", host, os.Getpid())
			}
			return demoWorker(cmd, g, o)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "", "worker name (default <hostname>/<pid>)")
	f.IntVar(&o.periods, "periods", 0, "periods to take part in (0: until stopped)")
	f.IntVar(&o.first, "first", 0, "first period (0: one past the highest period done)")
	f.DurationVar(&o.ttl, "ttl", 2*time.Second, fmt.Sprintf("lease TTL (%s to %s)", leases.MinTTL, maxDemoTTL))
	f.DurationVar(&o.work, "work", time.Second, fmt.Sprintf("simulated work per period, under the lease (0s to %s)", maxDemoWork))
	f.BoolVar(&o.supervised, "supervised", false, "speak JSON to the demo parent, wait for its go-ahead before each write")
	_ = f.MarkHidden("supervised")
	return cmd
}

// worker is one demo worker's state.
type worker struct {
	o    workerOptions
	pool *pgxpool.Pool
	lc   *leases.Client
	out  io.Writer
	gos  <-chan struct{} // supervised: one value per go-ahead from the parent
}

func demoWorker(cmd *cobra.Command, g *globals, o workerOptions) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w := &worker{o: o, out: cmd.OutOrStdout()}
	if o.supervised {
		// The parent's go-aheads arrive on stdin; EOF means the parent is
		// gone, and the worker stops.
		gos := make(chan struct{}, 1)
		w.gos = gos
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			defer cancel()
			sc := bufio.NewScanner(os.Stdin)
			for sc.Scan() {
				select {
				case gos <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	pool, err := openSchemaPool(ctx, g.connString(), "pgfence demo worker "+o.name, 4)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setupDemo(ctx, pool, false); err != nil {
		return err
	}
	lc, err := leases.New(pool, leases.WithOwner(o.name))
	if err != nil {
		return fmt.Errorf("leases client: %w", err)
	}
	defer lc.Close()
	w.pool, w.lc = pool, lc

	if w.gos != nil {
		// Start together, so that the first periods are a fair race.
		w.emit(demoEvent{Event: "started"})
		select {
		case <-w.gos:
		case <-ctx.Done():
			return nil
		}
	}
	first := o.first
	if first == 0 {
		if err := pool.QueryRow(ctx, sqlDemoNext).Scan(&first); err != nil {
			return fmt.Errorf("find the next period: %w", err)
		}
	}
	for n := first; o.periods == 0 || n < first+o.periods; n++ {
		if err := w.period(ctx, n); err != nil {
			if ctx.Err() != nil {
				break // stopped
			}
			w.emit(demoEvent{Event: "error", Period: n, Error: err.Error()})
			return err
		}
	}
	w.emit(demoEvent{Event: "done"})
	return nil
}

// period takes part in period n: skip it if done, else take its lease,
// check again under the lease, work, and write the row with the lease's
// token. Errors other than a stale write end the worker.
func (w *worker) period(ctx context.Context, n int) error {
	if done, err := w.done(ctx, n); err != nil || done {
		return err
	}
	lease, err := w.lc.Acquire(ctx, demoLeaseName(n), w.o.ttl)
	if err != nil {
		return fmt.Errorf("acquire %s: %w", demoLeaseName(n), err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = lease.Release(rctx) // fails once lost; expiry covers it
	}()
	w.emit(demoEvent{Event: "acquired", Period: n, Fence: lease.Fence()})
	done, err := w.done(ctx, n)
	if err != nil {
		return err
	}
	if done {
		w.emit(demoEvent{Event: "skipped", Period: n, Fence: lease.Fence()})
		return nil
	}
	// Work under the lease; a worker that notices its lease is gone stops.
	t := time.NewTimer(w.o.work)
	select {
	case <-t.C:
	case <-lease.Done():
		t.Stop()
		w.emit(demoEvent{Event: "lost", Period: n, Fence: lease.Fence(), Error: fmt.Sprint(context.Cause(lease.Context()))})
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	if w.gos != nil {
		// Between the check and the write is where a pause makes a
		// holder stale: the parent may SIGSTOP us here.
		w.emit(demoEvent{Event: "ready", Period: n, Fence: lease.Fence()})
		select {
		case <-w.gos:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The write deliberately does not consult lease.Done() again: a
	// process that was frozen cannot know it was, and the database is what
	// stops it. A stop does not cut it short either: a commit interrupted
	// by a cancelled context may have happened or not, and the worker
	// could not say whether it did the period.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), demoWriteTimeout)
	defer cancel()
	fence, retries, err := w.write(wctx, lease.Token(), n)
	switch {
	case fencing.IsStale(err):
		w.emit(demoEvent{Event: "stale", Period: n, Fence: lease.Fence(), Retries: retries, Error: err.Error()})
		return nil
	case err != nil:
		return fmt.Errorf("write period %d (%d retries after serialization failures): %w", n, retries, err)
	}
	w.emit(demoEvent{Event: "wrote", Period: n, Fence: fence, Retries: retries})
	return nil
}

// demoWriteAttempts bounds the attempts of a period's fenced write.
const demoWriteAttempts = 10

// write writes period n's row in a fenced transaction declaring tok, and
// returns the fence the guard stamped on it and how many times it retried.
//
// Under repeatable read and serializable (a role's or database's
// default_transaction_isolation, or the connection string's options) the
// guard refuses a write whose lease row changed after the transaction's
// snapshot with a serialization failure (40001) rather than PF001: a renewal
// of the holder's own lease does that, and so does any grant or release
// after a stale holder's snapshot (fencing/doc.go, "The fence lock"). The
// transaction did not commit, and the write is retried with a new snapshot,
// as the guard's documentation says, at most demoWriteAttempts times while
// ctx lasts: the current holder's write then lands, and a stale holder's is
// refused with PF001, which only a superseded grant gets.
func (w *worker) write(ctx context.Context, tok fencing.Token, n int) (fence int64, retries int, err error) {
	for backoff := time.Millisecond; ; backoff = min(2*backoff, 64*time.Millisecond) {
		err = fencing.InTx(ctx, w.pool, tok, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, sqlDemoWrite, n, w.o.name).Scan(&fence)
		})
		switch pgerr.Code(err) {
		case pgerr.SerializationFailure, pgerr.DeadlockDetected:
		default:
			return fence, retries, err
		}
		if retries+1 >= demoWriteAttempts {
			return 0, retries, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, retries, err
		case <-t.C:
		}
		retries++
	}
}

func (w *worker) done(ctx context.Context, n int) (bool, error) {
	var done bool
	if err := w.pool.QueryRow(ctx, sqlDemoDone, n).Scan(&done); err != nil {
		return false, fmt.Errorf("check period %d: %w", n, err)
	}
	return done, nil
}

func (w *worker) emit(e demoEvent) {
	e.Worker = w.o.name
	if w.o.supervised {
		b, _ := json.Marshal(e)
		fmt.Fprintf(w.out, "%s\n", b)
		return
	}
	var msg string
	switch e.Event {
	case "acquired":
		msg = fmt.Sprintf("acquired %s (fence %d)", demoLeaseName(e.Period), e.Fence)
	case "skipped":
		msg = "already done by another worker"
	case "wrote":
		msg = fmt.Sprintf("did the work: wrote the row with fence %d%s", e.Fence, retried(e))
	case "stale":
		msg = fmt.Sprintf("write with fence %d REJECTED by the database (stale)%s: %s", e.Fence, retried(e), e.Error)
	case "lost":
		msg = fmt.Sprintf("lease lost while working (%s): not writing", e.Error)
	case "error":
		msg = "error: " + e.Error
	case "done":
		fmt.Fprintf(w.out, "%s: finished\n", e.Worker)
		return
	default:
		msg = e.Event
	}
	fmt.Fprintf(w.out, "%s: period %d: %s\n", e.Worker, e.Period, msg)
}

// setupDemo creates the demo table and protects it (idempotent, serialised
// among workers); with reset it first drops the demo schema.
func setupDemo(ctx context.Context, pool *pgxpool.Pool, reset bool) error {
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlDemoSetupLock); err != nil {
			return err
		}
		if reset {
			if _, err := tx.Exec(ctx, sqlDemoDrop); err != nil {
				return err
			}
		}
		for _, q := range []string{sqlDemoSchema, sqlDemoTable} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		var protected bool
		if err := tx.QueryRow(ctx, sqlDemoProtected).Scan(&protected); err != nil {
			return err
		}
		if !protected {
			return fencing.Protect(ctx, tx, demoTable)
		}
		return nil
	})
	if err != nil {
		return schemaHint(fmt.Errorf("set up the demo table %s: %w", demoTable, err))
	}
	return nil
}
