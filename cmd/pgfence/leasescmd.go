package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/internal/names"
	"github.com/pgfence/pgfence/leases"
)

func newLeasesCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "Inspect, hand over and force-release leases",
		Args:  argsUsage(cobra.NoArgs),
		RunE:  action(func(cmd *cobra.Command, _ []string) error { return cmd.Help() }),
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List leases: owner, fence, expiry, how long held",
		Long: `List the rows of pgfence.leases: name, owner, fence, when the grant expires
(or how long ago it expired) and how long the current owner has held it.
Times are judged by the database clock. A row stays after its lease is
released or expires, with its last grant's owner and fence: it is listed as
expired, until 'pgfence leases prune' deletes it. An expired row is free:
the next acquirer takes it with a higher fence.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return withPool(ctx, g, "pgfence leases", 1, 0, func(ctx context.Context, pool *pgxpool.Pool, now time.Time) error {
				rows, err := listLeases(ctx, pool, now)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), rows)
				}
				return printLeases(cmd, rows)
			})
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (an array of objects) instead of a table")

	var (
		force     bool
		terminate bool
		timeout   time.Duration
	)
	release := &cobra.Command{
		Use:   "release --force [--timeout D] [--terminate] NAME",
		Short: "Break-glass: make a lease expire now",
		Long: `Make lease NAME expire now, whoever holds it. This is the operator's
break-glass for a holder that is stuck but still renewing.

The holder's next renewal fails and its lease context is cancelled (a
'pgfence run' holder then stops its command); the next grant gets a higher
fence, so fenced writes of the old holder are rejected. The holder may still
be running until it notices — at most about a third of its TTL. Requires
--force. Fails (exit 1) when nobody holds NAME.

It never hangs: a holder frozen inside an open fenced transaction keeps the
lease locked, and the release waits at most --timeout for it, then fails
naming the blocking backends (pid, application, client address, since when).
With --terminate it ends those backends (pg_terminate_backend: the role
needs pg_signal_backend, which pgfence_operator has when the migration could
grant it; sessions merely queued for the same lock, such as a waiting
takeover, are left alone) and, if the lease still has the grant it had,
tries once more; their open transactions roll back. A grant made meanwhile
(a takeover that waited behind them) is not released: exit 1. A fenced
write in a prepared transaction (two-phase commit) holds the lease with no
backend; the error names it by its GID, and only COMMIT PREPARED or
ROLLBACK PREPARED ends it.`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !force {
				return usageErrorf("leases release breaks a lease someone may be relying on: add --force to release %q", name)
			}
			if err := validateLeaseName(name); err != nil {
				return err
			}
			if timeout < time.Millisecond || timeout > time.Hour {
				return usageErrorf("--timeout must be between 1ms and 1h, got %s", timeout)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			opts := []leases.Option{leases.WithForceReleaseTimeout(timeout)}
			return withLeases(ctx, g, "pgfence leases release", 2*timeout, opts, func(ctx context.Context, lc *leases.Client, now time.Time) error {
				before, err := lc.Get(ctx, name)
				if err != nil && !errors.Is(err, leases.ErrNotHeld) {
					return fmt.Errorf("read lease %q: %w", name, err)
				}
				held := err == nil
				err = lc.ForceRelease(ctx, name)
				var blocked *leases.BlockedError
				if terminate && errors.As(err, &blocked) && len(blocked.Blockers) > 0 {
					if terr := terminateBackends(ctx, g, blocked.Blockers); terr != nil {
						return fmt.Errorf("%w; --terminate: %w", err, terr)
					}
					fmt.Fprintf(cmd.ErrOrStderr(), "pgfence: %v: terminated %d backend(s)\n", err, len(blocked.Blockers))
					if err = againIfSame(ctx, lc, name, held, before); errors.Is(err, leases.ErrNotHeld) && held {
						// The grant expired while the release waited, or
						// its holder let go once its backends ended: the
						// lease is free, as asked.
						fmt.Fprintf(cmd.OutOrStdout(), "lease %q is free now: it was held by %s (fence %d), and expired or was let go while the release waited for the blocking backends\n",
							name, orDash(display(before.Owner)), before.Fence)
						return nil
					} else if err != nil && !errors.Is(err, leases.ErrNotHeld) {
						return err
					}
				}
				if err != nil {
					if errors.Is(err, leases.ErrNotHeld) {
						return fmt.Errorf("lease %q is not held (no such lease, or it has already expired): nothing to release; see 'pgfence leases ls'", name)
					}
					if errors.As(err, &blocked) {
						return blockedAdvice(err, blocked, terminate)
					}
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "released lease %q (was held by %s, fence %d); its holder's next renewal fails and the next grant gets a higher fence\n",
					name, orDash(display(before.Owner)), before.Fence)
				return nil
			})
		}),
	}
	release.Flags().BoolVar(&force, "force", false, "confirm that the lease should be broken")
	release.Flags().DurationVar(&timeout, "timeout", leases.DefaultForceReleaseTimeout, "how long to wait for a lease locked by the holder's open fenced transaction (1ms..1h)")
	release.Flags().BoolVar(&terminate, "terminate", false, "end the backends that block the release (their transactions roll back) and try again")
	var handoverTimeout time.Duration
	handover := &cobra.Command{
		Use:   "handover [--timeout D] NAME",
		Short: "Ask the holder of a lease to step down, and wait until it has",
		Long: `Ask the holder of lease NAME to hand it over, for a rolling deploy, and
wait until it has released. The holder's lease context ends (cause: hand-over
requested) while it still holds the lease; Run and Lead release once their
work has returned, and a waiting replica takes over within a round trip. So,
unlike 'release --force', nobody else holds the lease while the old holder's
work may still run. A holder whose client listens (Lead) hears the request at
once; others at their next renewal (within a third of the TTL).

A holder that does not release within --timeout is reported (exit 1) and
keeps the lease: nothing is forced. Fails (exit 1) when nobody holds NAME.
The role needs pgfence_operator.`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := validateLeaseName(name); err != nil {
				return err
			}
			if handoverTimeout < time.Millisecond || handoverTimeout > time.Hour {
				return usageErrorf("--timeout must be between 1ms and 1h, got %s", handoverTimeout)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return withLeases(ctx, g, "pgfence leases handover", handoverTimeout, nil, func(ctx context.Context, lc *leases.Client, _ time.Time) error {
				asked, err := lc.RequestHandover(ctx, name, handoverTimeout)
				switch {
				case errors.Is(err, leases.ErrNotHeld):
					return fmt.Errorf("lease %q is not held (no such lease, or it has already expired): nothing to hand over; see 'pgfence leases ls'", name)
				case errors.Is(err, leases.ErrHandoverTimeout):
					return fmt.Errorf("%w; it keeps the lease (if it is stuck: pgfence leases release --force %s)", err, shellArg(name))
				case err != nil:
					return err
				}
				now, err := lc.Get(ctx, name)
				next := "nobody yet"
				if err == nil {
					next = fmt.Sprintf("%s (fence %d)", display(now.Owner), now.Fence)
				} else if !errors.Is(err, leases.ErrNotHeld) {
					return fmt.Errorf("read lease %q: %w", name, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "handed over lease %q: %s (fence %d) stepped down; now held by %s\n",
					name, display(asked.Owner), asked.Fence, next)
				return nil
			})
		}),
	}
	handover.Flags().DurationVar(&handoverTimeout, "timeout", 30*time.Second, "how long to wait for the holder to release (1ms..1h)")
	cmd.AddCommand(ls, release, handover, newPruneCmd(g))
	return cmd
}

// withPool opens a pool of conns connections for one command, checks the
// schema, reads the database clock, runs fn and closes the pool; all of it
// bounded (see bounded) by answerTimeout plus wait, the waits the command
// was asked for.
func withPool(ctx context.Context, g *globals, app string, conns int32, wait time.Duration, fn func(context.Context, *pgxpool.Pool, time.Time) error) error {
	return bounded(ctx, wait, func(ctx context.Context) error {
		pool, err := openSchemaPool(ctx, g.connString(), app, conns)
		if err != nil {
			return err
		}
		defer pool.Close()
		var now time.Time
		if err := pool.QueryRow(ctx, sqlNow).Scan(&now); err != nil {
			return fmt.Errorf("read the database clock: %w", err)
		}
		return fn(ctx, pool, now)
	})
}

// withLeases is withPool with a leases client on the pool.
func withLeases(ctx context.Context, g *globals, app string, wait time.Duration, opts []leases.Option, fn func(context.Context, *leases.Client, time.Time) error) error {
	return withPool(ctx, g, app, 2, wait, func(ctx context.Context, pool *pgxpool.Pool, now time.Time) error {
		lc, err := leases.New(pool, opts...)
		if err != nil {
			return fmt.Errorf("leases client: %w", err)
		}
		defer lc.Close()
		return fn(ctx, lc, now)
	})
}

// blockedAdvice adds to a release's *leases.BlockedError what the operator
// can do about what blocks it.
func blockedAdvice(err error, b *leases.BlockedError, terminated bool) error {
	const prepared = "a prepared transaction has no backend to terminate: COMMIT PREPARED or ROLLBACK PREPARED it, whichever its two-phase commit coordinator decided"
	switch {
	case len(b.Prepared) == 0 && terminated:
		return err
	case len(b.Prepared) == 0:
		return fmt.Errorf("%w (add --terminate to end them)", err)
	case len(b.Blockers) > 0 && !terminated:
		return fmt.Errorf("%w (add --terminate to end the backends; %s)", err, prepared)
	default:
		return fmt.Errorf("%w (%s)", err, prepared)
	}
}

// againIfSame force-releases lease name once more after --terminate ended
// the backends that blocked the first try, if it still has the grant the
// command read before (held, before). A takeover that waited behind the
// same backends may have been granted the lease meanwhile: that grant is
// not the one the operator meant to break. ErrNotHeld if nothing was held.
func againIfSame(ctx context.Context, lc *leases.Client, name string, held bool, before leases.Info) error {
	now, err := lc.Get(ctx, name)
	switch {
	case errors.Is(err, leases.ErrNotHeld):
		return err
	case err != nil:
		return fmt.Errorf("read lease %q: %w", name, err)
	case !held || now.Fence != before.Fence:
		return fmt.Errorf("lease %q was granted again (to %s, fence %d) once the blocking backends ended: not released", name, orDash(display(now.Owner)), now.Fence)
	}
	return lc.ForceRelease(ctx, name)
}

// terminateBackends ends the given backends and waits until they are gone.
func terminateBackends(ctx context.Context, g *globals, bs []leases.Backend) error {
	pool, err := openPool(ctx, g.connString(), "pgfence leases release --terminate", 1)
	if err != nil {
		return err
	}
	defer pool.Close()
	pids := make([]int64, len(bs))
	for i, b := range bs {
		pids[i] = b.PID
	}
	var ended int
	if err := pool.QueryRow(ctx, sqlTerminate, pids).Scan(&ended); err != nil {
		return fmt.Errorf("terminate backends %v: %w", pids, err)
	}
	if ended != len(pids) {
		return fmt.Errorf("terminated %d of backends %v (the others had ended, or the role may not signal them: it needs pg_signal_backend)", ended, pids)
	}
	return nil
}

// leaseRow is one row of `leases ls` (and its JSON form). Durations are
// judged against the database clock read just before the listing.
type leaseRow struct {
	Name       string    `json:"name"`
	Owner      string    `json:"owner"`
	Fence      int64     `json:"fence"`
	AcquiredAt time.Time `json:"acquired_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	Expired    bool      `json:"expired"`
	// ExpiresInSeconds is negative for an expired lease.
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
	// HeldForSeconds is how long the current owner has held the lease;
	// absent once expired.
	HeldForSeconds *float64 `json:"held_for_seconds,omitempty"`
	// Data is the JSON value the grant published; absent for none.
	Data json.RawMessage `json:"data,omitempty"`
}

func newLeaseRow(in leases.Info, now time.Time) leaseRow {
	r := leaseRow{
		Name: in.Name, Owner: in.Owner, Fence: in.Fence,
		AcquiredAt: in.AcquiredAt, RenewedAt: in.RenewedAt, ExpiresAt: in.ExpiresAt,
		Expired:          !in.ExpiresAt.After(now),
		ExpiresInSeconds: in.ExpiresAt.Sub(now).Seconds(),
		Data:             in.Data,
	}
	if !r.Expired {
		h := now.Sub(in.AcquiredAt).Seconds()
		r.HeldForSeconds = &h
	}
	return r
}

// listLeases reads every row of the lease table, expired ones too, judged
// by now, the database clock.
func listLeases(ctx context.Context, pool *pgxpool.Pool, now time.Time) ([]leaseRow, error) {
	rs, err := pool.Query(ctx, sqlLeases)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list leases: %w", err))
	}
	rows, err := pgx.CollectRows(rs, func(row pgx.CollectableRow) (leaseRow, error) {
		var in leases.Info
		err := row.Scan(&in.Name, &in.Owner, &in.Fence, &in.AcquiredAt, &in.RenewedAt, &in.ExpiresAt, &in.Data)
		return newLeaseRow(in, now), err
	})
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list leases: %w", err))
	}
	return rows, nil
}

func printLeases(cmd *cobra.Command, rows []leaseRow) error {
	w := cmd.OutOrStdout()
	if len(rows) == 0 {
		fmt.Fprintln(w, "no leases")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tOWNER\tFENCE\tEXPIRES\tHELD FOR\tDATA")
	for _, r := range rows {
		d := time.Duration(r.ExpiresInSeconds * float64(time.Second))
		expires, held := "in "+human(d), "-"
		if r.Expired {
			expires = "expired " + human(d) + " ago"
		}
		if r.HeldForSeconds != nil {
			held = human(time.Duration(*r.HeldForSeconds * float64(time.Second)))
		}
		data := "-"
		if r.Data != nil {
			data = string(r.Data) // JSON: a leading quote is its own
			if !printable(data) {
				data = strconv.Quote(data)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", display(r.Name), display(r.Owner), r.Fence, expires, held, data)
	}
	return tw.Flush()
}

// validateLeaseName applies the lease table's rules before connecting, so
// that bad input exits 2 and touches nothing.
func validateLeaseName(name string) error {
	return validateName("lease name", name, leases.MaxNameLen)
}

// validateName applies the rules of the leases and pglock packages (1 to
// maxLen bytes of UTF-8 without NUL) to what names, before connecting.
func validateName(what, name string, maxLen int) error {
	if err := names.Check(name, maxLen); err != nil {
		return usageErrorf("%s %v", what, err)
	}
	return nil
}
