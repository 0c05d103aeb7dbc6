package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

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
a pglock holder notices (Lock.Done) within milliseconds over pgx, within
its liveness interval and timeout over database/sql. A prepared
transaction (two-phase commit) holds its transaction-level locks with no
session (pid 0; --json's gid names it, SINCE is when it was prepared): only
COMMIT PREPARED or ROLLBACK PREPARED with its GID releases them.`,
		Args: argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var locks []lockRow
			err := bounded(ctx, 0, func(ctx context.Context) error {
				pool, err := openPool(ctx, g.connString(), "pgfence locks", 1)
				if err != nil {
					return err
				}
				defer pool.Close()
				locks, err = listLocks(ctx, pool)
				return err
			})
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
compute and take the same lock. Needs no database. A name pglock refuses
(empty, over 200 bytes, not UTF-8, with a NUL) exits 2, as with run --lock.`,
		Args: argsUsage(cobra.ExactArgs(1)),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := validateName("lock name", name, pglock.MaxNameLen); err != nil {
				return err
			}
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

// lockRow is one row of `locks ls` (and its JSON form; field names are part
// of the command's interface).
type lockRow struct {
	Key             int64      `json:"key,string"` // a string: keys use all 64 bits, beyond JSON-safe integers
	Mode            string     `json:"mode"`       // ExclusiveLock or ShareLock, as pg_locks says
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
	// GID names the prepared transaction holding the lock (pid 0, no
	// session; since is when it was prepared); "" for a session.
	GID string `json:"gid"`
}

// newLockRow renders a pglock.Info for `locks ls`: SINCE is the wait start
// for a waiter and the session's last state change for a holder, aged by
// the database clock.
func newLockRow(i pglock.Info) lockRow {
	r := lockRow{
		Key: i.Key, Mode: "ExclusiveLock", Granted: i.Granted, PID: i.PID,
		ApplicationName: i.ApplicationName, ClientAddr: i.ClientAddr, State: i.State,
		BackendStart: timeOrNil(i.BackendStart), GID: i.GID,
	}
	if i.Shared {
		r.Mode = "ShareLock"
	}
	switch {
	case i.GID != "":
		r.Since, r.SinceSource = timeOrNil(i.Prepared), "prepared"
	case i.Granted:
		r.Since, r.SinceSource = timeOrNil(i.StateChange), "state_change"
	default:
		r.Since, r.SinceSource = timeOrNil(i.WaitStart), "waitstart"
	}
	if r.Since != nil {
		s := i.ReadAt.Sub(*r.Since).Seconds()
		r.SinceSeconds = &s
	}
	return r
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// listLocks lists the advisory locks of the pool's database through pglock.
func listLocks(ctx context.Context, pool *pgxpool.Pool) ([]lockRow, error) {
	locker, err := pglock.New(pool)
	if err != nil {
		return nil, err
	}
	infos, err := locker.List(ctx)
	if err != nil {
		return nil, err
	}
	rows := make([]lockRow, len(infos))
	for i, info := range infos {
		rows[i] = newLockRow(info)
	}
	return rows, nil
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
		pid, app, client := strconv.Itoa(int(r.PID)), orDash(r.ApplicationName), clientOrLocal(r.ClientAddr)
		if r.GID != "" {
			pid, app, client = "-", "prepared transaction "+strconv.Quote(r.GID), "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Key, r.Mode, state, since, pid, app, client)
	}
	return tw.Flush()
}

// quoteLiteral quotes s as an SQL string literal to print for pasting into
// psql: a standard literal when every character of s prints and none is a
// backslash, else an escape string (E'...'), which reads the same whatever
// the session's standard_conforming_strings.
func quoteLiteral(s string) string {
	if printable(s) && !strings.ContainsRune(s, '\\') {
		return "'" + strings.ReplaceAll(s, "'", "''") + "'"
	}
	// An escape string: a character that would act on the terminal (an
	// escape sequence, a newline) or not show (U+200B) is written as its
	// code, so that what is printed reads as the name and still computes
	// its key when pasted into psql.
	var b strings.Builder
	b.WriteString("E'")
	for _, r := range s {
		switch {
		case r == '\\' || r == '\'':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < utf8.RuneSelf && unicode.IsPrint(r):
			b.WriteRune(r)
		case r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsPrint(r) && r != unicode.ReplacementChar:
			b.WriteRune(r)
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// takeLock takes the advisory lock of run --lock: waiting, or with
// --no-wait failing at once (exit 75) with the holder's session named.
func takeLock(ctx context.Context, pool *pgxpool.Pool, o runOptions) (*held, error) {
	locker, err := pglock.New(pool)
	if err != nil {
		return nil, err
	}
	var lk *pglock.Lock
	if o.noWait {
		lk, err = locker.TryLock(ctx, o.lock)
	} else {
		lk, err = locker.Lock(ctx, o.lock)
	}
	var he *pglock.HeldError
	switch {
	case errors.As(err, &he):
		return nil, &exitError{code: exitHeld, err: fmt.Errorf("%w (key %d; break it with SELECT pg_terminate_backend(pid))", he, he.Key)}
	case err != nil:
		return nil, err
	}
	return &held{
		what: fmt.Sprintf("lock %q (key %d)", lk.Name(), lk.Key()),
		env: []string{
			"PGFENCE_LOCK=" + lk.Name(),
			"PGFENCE_LOCK_KEY=" + strconv.FormatInt(lk.Key(), 10),
		},
		done:    lk.Done(),
		cause:   lk.Err,
		release: lk.Unlock,
	}, nil
}
