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

	"github.com/pgfence/pgfence/internal/pgerr"
)

// defaultFenceGap is pgfence.bump_fence's default: an hour, in
// microseconds (fences are microseconds of the database clock).
const defaultFenceGap int64 = 3_600_000_000

// sqlBumpFence raises the fence floor by $1 above every fence issued and
// the database clock; it returns the new floor.
const sqlBumpFence = `SELECT pgfence.bump_fence($1::bigint)`

// maxFenceFloor is the highest fence floor pgfence.bump_fence sets
// (migration 4): the upper half of bigint is kept for the clock. It
// refuses a higher one with SQLSTATE 22003 (numeric_value_out_of_range).
const (
	maxFenceFloor      int64 = 1<<62 - 1
	sqlstateOutOfRange       = "22003"
)

// sqlstateReadOnly is what bump_fence raises on a standby, or in a session
// whose role or database sets default_transaction_read_only
// (read_only_sql_transaction).
const sqlstateReadOnly = "25006"

func newFenceCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fence",
		Short: "Manage fences (after a server clock was behind)",
		Args:  argsUsage(cobra.NoArgs),
		RunE:  action(func(cmd *cobra.Command, _ []string) error { return cmd.Help() }),
	}
	var gap int64
	bump := &cobra.Command{
		Use:   "bump [--gap N]",
		Short: "Raise the fence floor above every fence a lost history may have issued",
		Long: `Raise pgfence's fence floor to --gap microseconds (default one hour) above
every fence in the lease table and above the database clock: every fence
granted afterwards exceeds it.

Fences are microseconds of the database clock, raised past the lease's
previous fence, so after a failover, a restore or a rollback they already
exceed every fence the lost history issued — as long as the server's clock
is not behind the old one's by more than the time that passed. Run this
when it may be: a new primary whose clock was wrong, a restore onto a host
with a skewed clock. Give a --gap larger than the skew. Safe to repeat.

Must run on the primary as pgfence_operator (or the role that applied
pgfence's migrations).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			switch {
			case gap < 1:
				return usageErrorf("--gap must be at least 1, got %d", gap)
			case gap >= maxFenceFloor:
				// The floor is raised to the clock's microseconds or
				// more, plus the gap: this one can never fit.
				return usageErrorf("--gap must be below %d, got %d: the fence floor may rise to %d at most (the upper half of bigint is kept for the clock), "+
					"and the gap is added to the database clock's microseconds or more", maxFenceFloor, gap, maxFenceFloor)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return bounded(ctx, 0, func(ctx context.Context) error { return bumpFence(ctx, cmd, g, gap) })
		}),
	}
	bump.Flags().Int64Var(&gap, "gap", defaultFenceGap, fmt.Sprintf("how far above every fence and the clock to raise the floor, in microseconds (at least 1, below %d)", maxFenceFloor))
	cmd.AddCommand(bump)
	return cmd
}

func bumpFence(ctx context.Context, cmd *cobra.Command, g *globals, gap int64) error {
	pool, err := openSchemaPool(ctx, g.connString(), "pgfence fence bump", 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	var floor int64
	if err := pool.QueryRow(ctx, sqlBumpFence, gap).Scan(&floor); err != nil {
		if pgerr.Code(err) == sqlstateOutOfRange {
			return fmt.Errorf("bump fences: --gap %d does not fit above the current fences and clock: the fence floor may rise to %d at most; give a smaller --gap (%w)",
				gap, maxFenceFloor, err)
		}
		return bumpError(err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "raised the fence floor: every fence granted from now on exceeds %d\n", floor)
	return nil
}

// bumpError explains the likely causes of a failed bump.
func bumpError(err error) error {
	return operatorError("bump fences", "pgfence.bump_fence is missing or outdated", "raise the fence floor", err)
}

// operatorError explains, by SQLSTATE, the likely causes of a failed call
// of an operator's function by command op: missing (the schema is older
// than the function), a role that may not do what (only
// pgfence_operator may), a standby or a read-only default.
func operatorError(op, missing, what string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case sqlstateUndefinedFunction, sqlstateUndefinedTable:
			return fmt.Errorf("%s: run `pgfence migrate up` (%w)", missing, err)
		case sqlstateInsufficientPriv:
			return fmt.Errorf("%s: only pgfence_operator (or the role that applied pgfence's migrations) may %s (%w)", op, what, err)
		case sqlstateReadOnly:
			// A standby, or default_transaction_read_only on a primary:
			// the same SQLSTATE; pgerr's hint names both.
			return fmt.Errorf("%s: %s (%w)", op, pgerr.HintStandby, err)
		}
	}
	return fmt.Errorf("%s: %w", op, err)
}
