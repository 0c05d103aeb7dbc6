package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/spf13/cobra"
)

// defaultFenceGap is pgfence.bump_fence's default and the gap
// pgfence.next_fence() skips after a failover (migration 3): 2^32.
const defaultFenceGap int64 = 1 << 32

// sqlBumpFence advances fences by $1 and records the server's epoch; it
// returns the sequence's value afterwards and the epoch recorded.
const sqlBumpFence = `
SELECT b.floor, e.system_identifier, e.timeline
  FROM pgfence.bump_fence($1::bigint) AS b(floor), pgfence.fence_epoch AS e`

// sqlstateReadOnly is what pgfence.next_fence() and bump_fence raise on a
// standby (read_only_sql_transaction).
const sqlstateReadOnly = "25006"

func newFenceCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Manage the fence sequence (after a restore or a failover)",
		Args:  argsUsage(cobra.NoArgs),
		RunE:  action(func(cmd *cobra.Command, _ []string) error { return cmd.Help() }),
	}
	var gap int64
	bump := &cobra.Command{
		Use:   "bump [--gap N]",
		Short: "Advance every future fence past values a lost WAL tail or an old backup may have handed out",
		Long: `Advance pgfence's fence sequence by --gap (default 2^32) and record this
server's timeline as the current fence epoch: every fence granted afterwards
exceeds every fence granted before, including grants whose WAL was lost.

pgfence does this by itself on the first grant after a promotion (a new
timeline) and after a restore into another cluster (a new system
identifier). Run it by hand when the database may have gone back further
than the automatic gap covers: after a point-in-time recovery or a restore
from an old backup or dump, with --gap larger than the number of leases
granted since that backup. Safe to repeat: it only wastes fence values.

Must run on the primary, as the role that applied pgfence's migrations (or
one granted EXECUTE ON FUNCTION pgfence.bump_fence(bigint)).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			if gap < 1 {
				return usageErrorf("--gap must be at least 1, got %d", gap)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return bumpFence(ctx, cmd, g, gap)
		}),
	}
	bump.Flags().Int64Var(&gap, "gap", defaultFenceGap, "how far to advance the fence sequence (at least 1)")
	cmd.AddCommand(bump)
	return cmd
}

func bumpFence(ctx context.Context, cmd *cobra.Command, g *globals, gap int64) error {
	pool, err := openPool(ctx, g.connString(), "pgfence fence bump", 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(ctx, pool); err != nil {
		return err
	}
	var floor, sysid, timeline int64
	if err := pool.QueryRow(ctx, sqlBumpFence, gap).Scan(&floor, &sysid, &timeline); err != nil {
		return bumpError(err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "advanced fences by %d: every fence granted from now on exceeds %d (epoch: system %d, timeline %d)\n",
		gap, floor, sysid, timeline)
	return nil
}

// bumpError explains the likely causes of a failed bump, read by SQLSTATE.
func bumpError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateUndefinedFunction, sqlstateUndefinedTable:
			return fmt.Errorf("pgfence.bump_fence is missing: this database's pgfence schema predates fence epochs; run `pgfence migrate up` (%w)", err)
		case sqlstateInsufficientPriv:
			return fmt.Errorf("bump fences: only the role that applied pgfence's migrations, or one granted EXECUTE ON FUNCTION pgfence.bump_fence(bigint), may advance fences (%w)", err)
		case sqlstateReadOnly:
			return fmt.Errorf("bump fences: this server is a standby; connect to the primary (%w)", err)
		}
	}
	return fmt.Errorf("bump fences: %w", err)
}
