package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate up|down|version|force",
		Short: "Apply, revert, show or record pgfence's schema migrations",
		Long: `Apply, revert, show or record pgfence's schema (schema pgfence), from the migrations
embedded in this binary. golang-migrate's bookkeeping table is
` + migrations.Table + `, so pgfence's history never collides with the
application's own golang-migrate history.

  up       apply pending migrations (safe to run from many processes at once)
  down     revert all of them: drops schema pgfence and the guard triggers
           installed by pgfence.protect (fails if application objects depend on it),
           and the roles pgfence_client and pgfence_operator with every grant of
           them (GRANT pgfence_client TO app) unless another database uses them
  version  print the applied version ("0" when none), and "(dirty)" after a
           migration whose outcome is unknown (one the server refused
           changed nothing and leaves the version as it was)
  force N  record version N as applied, clean, running nothing: after a
           dirty version, once you have checked what the migration did

The upstream migrate CLI works on the same files:
  migrate -path ./migrations -database 'pgx5://user@host/db?x-migrations-table=` + migrations.Table + `' up`,
	}
	cmd.AddCommand(
		&cobra.Command{
			Use:   "up",
			Short: "Apply pending migrations",
			Args:  argsUsage(cobra.NoArgs),
			RunE: action(func(cmd *cobra.Command, _ []string) error {
				return runMigration(cmd, g, "up", migrations.Up)
			}),
		},
		&cobra.Command{
			Use:   "down",
			Short: "Revert all migrations (drops schema pgfence)",
			Args:  argsUsage(cobra.NoArgs),
			RunE: action(func(cmd *cobra.Command, _ []string) error {
				return runMigration(cmd, g, "down", migrations.Down)
			}),
		},
		&cobra.Command{
			Use:   "version",
			Short: "Print the applied migration version",
			Args:  argsUsage(cobra.NoArgs),
			RunE: action(func(cmd *cobra.Command, _ []string) error {
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				conn := g.connString()
				if err := checkConnect(ctx, conn); err != nil {
					return err
				}
				v, dirty, err := migrations.Version(ctx, conn)
				if err != nil {
					return err
				}
				if dirty {
					fmt.Fprintf(cmd.OutOrStdout(), "%d (dirty: a migration did not finish, and its outcome is unknown; check the schema, then record the right version with: pgfence migrate force N)\n", v)
					return &exitError{code: exitFailure}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d\n", v)
				return nil
			}),
		},
		&cobra.Command{
			Use:   "force N",
			Short: "Record version N as applied, clean, without running a migration",
			Args:  argsUsage(cobra.ExactArgs(1)),
			RunE: action(func(cmd *cobra.Command, args []string) error {
				v, err := strconv.ParseUint(args[0], 10, 0)
				if err != nil {
					return usageErrorf("migrate force: want a version number (0 for none), got %q", args[0])
				}
				if latest, err := migrations.Latest(); err == nil && v > uint64(latest) {
					// Before connecting; Force checks again.
					return usageErrorf("migrate force: version %d is not one of pgfence's migrations (0 to %d)", v, latest)
				}
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				conn := g.connString()
				if err := checkConnect(ctx, conn); err != nil {
					return err
				}
				if err := migrations.Force(ctx, conn, uint(v)); err != nil {
					if errors.Is(err, migrations.ErrInvalid) {
						return usageError(err)
					}
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "migrate force: schema pgfence recorded at version %d, clean (no migration was run)\n", v)
				return nil
			}),
		},
	)
	cmd.Args = argsUsage(func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return fmt.Errorf("migrate needs a subcommand: up, down, version or force")
		}
		return fmt.Errorf("unknown migrate subcommand %q: want up, down, version or force", args[0])
	})
	cmd.RunE = action(func(*cobra.Command, []string) error { return nil })
	return cmd
}

func runMigration(cmd *cobra.Command, g *globals, what string, fn func(context.Context, string, ...migrations.Option) error) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn := g.connString()
	if err := checkConnect(ctx, conn); err != nil {
		return err
	}
	// What the migrations could not do for want of privileges (create or
	// grant the roles, drop them), and what to run instead.
	notices := migrations.WithNotices(func(message, hint string) {
		w := cmd.ErrOrStderr()
		fmt.Fprintf(w, "NOTICE: %s\n", message)
		if hint != "" {
			fmt.Fprintf(w, "HINT: %s\n", hint)
		}
	})
	if err := fn(ctx, conn, notices); err != nil {
		return err
	}
	v, _, err := migrations.Version(ctx, conn)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "migrate %s: schema pgfence at version %d\n", what, v)
	return nil
}
