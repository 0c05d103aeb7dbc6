package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// sqlPrune deletes at most $2 lease rows expired more than $1 µs ago and
// returns how many (migration 17).
const sqlPrune = `SELECT pgfence.prune($1::bigint, $2::int)`

func newPruneCmd(g *globals) *cobra.Command {
	var (
		olderThan time.Duration
		batch     int
	)
	cmd := &cobra.Command{
		Use:   "prune [--older-than D] [--batch N]",
		Short: "Delete lease rows that expired long ago",
		Long: `Delete the rows of pgfence.leases whose grant expired more than
--older-than ago (default a week; database clock). A row stays after its
lease is released or expires; a service that names leases after entities
(a lease per invoice, per tenant) grows the table without bound. Run this
from cron.

Safe at any time: a deleted name's next grant still gets a higher fence
than any it had (the fence floor is raised to the highest fence deleted,
in the same transaction), a row whose last holder's fenced transaction is
still open, or that a grant is taking now, is left for the next run, and
no live lease is touched. Deletes in transactions of at most --batch rows.

Must run on the primary as pgfence_operator (or the role that applied
pgfence's migrations).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return usageErrorf("--older-than must not be negative, got %s", olderThan)
			}
			if batch < 1 || batch > 1_000_000 {
				return usageErrorf("--batch must be between 1 and 1000000, got %d", batch)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return pruneLeases(ctx, cmd, g, olderThan, batch)
		}),
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 7*24*time.Hour, "delete rows whose grant expired more than this long ago")
	cmd.Flags().IntVar(&batch, "batch", 10_000, "rows deleted per transaction (1..1000000)")
	return cmd
}

// pruneLeases deletes in batches until one deletes fewer than batch rows.
// Each batch is bounded on its own (bounded), so a large table is not cut
// short by answerTimeout, and a server that stops answering still is.
func pruneLeases(ctx context.Context, cmd *cobra.Command, g *globals, olderThan time.Duration, batch int) error {
	var pool *pgxpool.Pool
	err := bounded(ctx, 0, func(ctx context.Context) (err error) {
		pool, err = openSchemaPool(ctx, g.connString(), "pgfence leases prune", 1)
		return err
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	var total int64
	for {
		var n int64
		err := bounded(ctx, 0, func(ctx context.Context) error {
			return pool.QueryRow(ctx, sqlPrune, olderThan.Microseconds(), batch).Scan(&n)
		})
		if err != nil {
			if total > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %d lease rows before the error\n", total)
			}
			return pruneError(err)
		}
		total += n
		if n < int64(batch) {
			break
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), "deleted %d lease rows expired more than %s ago\n", total, olderThan)
	return nil
}

// pruneError explains the likely causes of a failed prune.
func pruneError(err error) error {
	return operatorError("prune leases", "pgfence.prune is missing", "delete lease rows", err)
}
