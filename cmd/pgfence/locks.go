package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/pglock"
)

func newLocksCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "locks",
		Short: "Inspect advisory locks (pglock) in the current database",
		Args:  argsUsage(cobra.NoArgs),
		RunE:  action(func(cmd *cobra.Command, _ []string) error { return cmd.Help() }),
	}
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List advisory locks held or awaited in the current database",
		Long: `List the advisory locks of the current database (pg_locks joined with
pg_stat_activity): key, mode, whether granted or waiting and since when, and
the session (pid, application_name, client address).

Keys are shown as the bigint passed to pg_advisory_lock; find a name's key
with 'pgfence locks key NAME'. PostgreSQL does not record when a lock was
granted: SINCE is the wait start (pg_locks.waitstart, PostgreSQL 14+) for a
waiter, and for a holder the session's last state change
(pg_stat_activity.state_change) — for an idle session the lock has been held
at least that long (pglock's liveness probe resets it about every second);
--json adds backend_start, when the session began: the lock is no older. Locks taken with the two-int4 form are not listed.

To break a lock, end its session: SELECT pg_terminate_backend(PID);
a pglock holder notices within about a second (Lock.Done).`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			pool, err := openPool(ctx, g.connString(), "pgfence locks", 1)
			if err != nil {
				return err
			}
			defer pool.Close()
			locks, err := listLocks(ctx, pool)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), locks)
			}
			return printLocks(cmd, locks)
		}),
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON (an array of objects) instead of a table")

	key := &cobra.Command{
		Use:   "key NAME",
		Short: "Print the advisory-lock key of a lock name",
		Long: `Print the bigint advisory-lock key pglock uses for NAME (the first 8 bytes of
SHA-256 of the UTF-8 name, big-endian, signed), and the psql expressions that
compute and take the same lock. Needs no database.`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d\n", pglock.Key(name))
			lit := quoteLiteral(name)
			fmt.Fprintf(w, "psql: SELECT pgfence.lock_key(%s);  -- the same key\n", lit)
			fmt.Fprintf(w, "      SELECT pg_advisory_lock(pgfence.lock_key(%s));  -- contend with pglock\n", lit)
			return nil
		}),
	}
	cmd.AddCommand(ls, key)
	return cmd
}

// lockRow is one row of `locks ls` (and its JSON form).
type lockRow struct {
	Key             int64      `json:"key,string"` // a string: keys use all 64 bits, beyond JSON-safe integers
	Mode            string     `json:"mode"`
	Granted         bool       `json:"granted"`
	Since           *time.Time `json:"since"`
	SinceSource     string     `json:"since_source"` // state_change or waitstart
	SinceSeconds    *float64   `json:"since_seconds"`
	PID             int32      `json:"pid"`
	ApplicationName string     `json:"application_name"`
	ClientAddr      string     `json:"client_addr"` // empty for a Unix-socket session
	State           string     `json:"state"`       // pg_stat_activity.state
	// BackendStart is when the session started: the lock is no older.
	BackendStart *time.Time `json:"backend_start"`
}

func listLocks(ctx context.Context, pool *pgxpool.Pool) ([]lockRow, error) {
	var version int
	if err := pool.QueryRow(ctx, sqlServerVersion).Scan(&version); err != nil {
		return nil, fmt.Errorf("read server version: %w", err)
	}
	waitstart := "l.waitstart"
	if version < 140000 {
		waitstart = "NULL::timestamptz"
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(sqlAdvisoryLocks, waitstart))
	if err != nil {
		return nil, fmt.Errorf("list advisory locks: %w", err)
	}
	out := []lockRow{}
	for rows.Next() {
		var r lockRow
		var now time.Time
		if err := rows.Scan(&r.Key, &r.Mode, &r.Granted, &r.Since, &r.SinceSource, &r.PID,
			&r.ApplicationName, &r.ClientAddr, &r.State, &r.BackendStart, &now); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read advisory locks: %w", err)
		}
		if r.Since != nil {
			s := now.Sub(*r.Since).Seconds()
			r.SinceSeconds = &s
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read advisory locks: %w", err)
	}
	return out, nil
}

func printLocks(cmd *cobra.Command, locks []lockRow) error {
	w := cmd.OutOrStdout()
	if len(locks) == 0 {
		fmt.Fprintln(w, "no advisory locks in this database")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tMODE\tSTATE\tSINCE\tPID\tAPPLICATION\tCLIENT")
	for _, r := range locks {
		state := "granted"
		if !r.Granted {
			state = "waiting"
		}
		since := "-"
		if r.SinceSeconds != nil {
			since = human(time.Duration(*r.SinceSeconds*float64(time.Second))) + " (" + r.SinceSource + ")"
		}
		client := r.ClientAddr
		if client == "" {
			client = "local"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Key, r.Mode, state, since, r.PID, orDash(r.ApplicationName), client)
	}
	return tw.Flush()
}

// quoteLiteral quotes s as an SQL string literal for display.
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
