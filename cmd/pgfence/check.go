package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

// minThreshold is the smallest --max-hold/--max-wait: PostgreSQL measures
// time in microseconds, and a shorter interval would be sent as zero.
const minThreshold = time.Microsecond

var checkLong = `Check for leases held, and advisory locks waited on, longer than a threshold,
for cron or a Nagios-style monitor. Only the current database is checked.

Reported:
  - tables below a protected table (partitions, inheritance children) that
    were added after pgfence.protect ran and lack the guard's triggers
    (pgfence.unguarded(); protect the parent again to fix them), and
    partitions detached from one, which keep half of the guard (protect
    them, or drop their pgfence_guard_truncate);
  - leases of pgfence.lease_status that have not expired and were acquired
    longer than --max-hold ago (held_for > D, by the database clock);
  - advisory locks (pglock's single-bigint keys) that a session has waited
    for longer than --max-wait (pg_locks.waitstart, PostgreSQL 14+; on older
    servers lock waits cannot be judged and none are reported), with the
    session (pid, application_name, client address) and the pids holding
    the key;
  - lease takeovers (and force-releases) that have waited longer than
    --max-wait for an expired holder's open fenced transaction, with the
    lease, the waiting session, the pids holding the lease's fence lock and
    the prepared transactions (two-phase commit) holding it, which no
    backend does: only COMMIT PREPARED or ROLLBACK PREPARED ends those.

Output: one line "OK: ..." and exit 0, or a line "CRITICAL: N leases held
longer than D, M advisory locks waited on longer than D" followed by a table
of the findings, and exit 4. --json prints one object instead:
  {"ok": bool, "max_hold_seconds": n, "max_wait_seconds": n,
   "leases": [...], "lock_waits": [...], "unguarded": [...],
   "blocked_takeovers": [...]}
where each lease is an object as in 'pgfence leases ls --json', and each lock
wait has key (a decimal string), mode, pid, application_name, client_addr,
state, waitstart, waited_seconds, backend_start, held_by (holders' pids) and
prepared (the GIDs of prepared transactions holding the key);
each unguarded table has table, protected_parent and missing_triggers; each
blocked takeover has lease, pid, application_name, client_addr, waitstart,
waited_seconds, held_by (pids) and prepared (GIDs).

Exit codes: 0 nothing found, 4 findings, 2 bad flags (nothing is queried),
69 database unreachable or not answering within ` + answerTimeout.String() + `, 1 any other error (e.g.
schema not migrated).`

func newCheckCmd(g *globals) *cobra.Command {
	var (
		maxHold, maxWait time.Duration
		asJSON           bool
	)
	cmd := &cobra.Command{
		Use:   "check --max-hold D [--max-wait D] [--json]",
		Short: "Alert on leases held, advisory locks or lease takeovers waited on longer than D (exit 4)",
		Long:  checkLong,
		Args:  argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("max-hold") {
				return usageErrorf("check needs --max-hold D, the longest acceptable lease hold (e.g. --max-hold 1h)")
			}
			if err := validThreshold("--max-hold", maxHold); err != nil {
				return err
			}
			if !cmd.Flags().Changed("max-wait") {
				maxWait = maxHold
			} else if err := validThreshold("--max-wait", maxWait); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			var rep *checkReport
			err := bounded(ctx, 0, func(ctx context.Context) error {
				pool, err := openPool(ctx, g.connString(), "pgfence check", 1)
				if err != nil {
					return err
				}
				defer pool.Close()
				rep, err = runCheck(ctx, pool, maxHold, maxWait)
				return err
			})
			if err != nil {
				return err
			}
			if asJSON {
				err = writeJSON(cmd.OutOrStdout(), rep)
			} else {
				err = printCheck(cmd, rep, maxHold, maxWait)
			}
			if err != nil {
				return err
			}
			if !rep.OK {
				return &exitError{code: exitFindings}
			}
			return nil
		}),
	}
	f := cmd.Flags()
	f.DurationVar(&maxHold, "max-hold", 0, "report unexpired leases held longer than this (required; e.g. 1h)")
	f.DurationVar(&maxWait, "max-wait", 0, "report advisory locks and lease takeovers waited on longer than this (default: --max-hold)")
	f.BoolVar(&asJSON, "json", false, "print one JSON object instead of text")
	return cmd
}

func validThreshold(flag string, d time.Duration) error {
	if d < minThreshold {
		return usageErrorf("%s must be positive and at least %s, got %s", flag, minThreshold, d)
	}
	return nil
}

// checkReport is the result of check, and its JSON form; field names are
// part of the command's interface.
type checkReport struct {
	OK             bool       `json:"ok"`
	MaxHoldSeconds float64    `json:"max_hold_seconds"`
	MaxWaitSeconds float64    `json:"max_wait_seconds"`
	Leases         []leaseRow `json:"leases"` // as in leases ls --json
	LockWaits      []longWait `json:"lock_waits"`
	// Unguarded are tables below a protected table (partitions, inheritance
	// children) that lack one of the guard's triggers: added after
	// pgfence.protect ran (running it again fixes them), or detached since.
	Unguarded []unguardedTable `json:"unguarded"`
	// BlockedTakeovers are sessions that have waited longer than
	// --max-wait for a lease's fence lock.
	BlockedTakeovers []blockedTakeover `json:"blocked_takeovers"`
}

// blockedTakeover is a session that has waited longer than --max-wait for
// a lease's fence lock: a takeover or force-release held back by an expired
// holder's open fenced transaction (a frozen backend, or a prepared
// transaction, which only COMMIT or ROLLBACK PREPARED ends).
type blockedTakeover struct {
	Lease           string    `json:"lease"` // "" if no lease row has the lock's hash
	PID             int32     `json:"pid"`
	ApplicationName string    `json:"application_name"`
	ClientAddr      string    `json:"client_addr"`
	WaitStart       time.Time `json:"waitstart"`
	WaitedSeconds   float64   `json:"waited_seconds"`
	HeldBy          []int32   `json:"held_by"`  // backends holding the lock
	Prepared        []string  `json:"prepared"` // GIDs of prepared transactions holding it
}

// unguardedTable is a row of pgfence.unguarded().
type unguardedTable struct {
	Table   string `json:"table"`
	Parent  string `json:"protected_parent"`
	Missing string `json:"missing_triggers"`
}

// longWait is a session that has waited for an advisory lock longer than
// --max-wait.
type longWait struct {
	Key             int64      `json:"key,string"` // as in locks ls: all 64 bits
	Mode            string     `json:"mode"`
	PID             int32      `json:"pid"`
	ApplicationName string     `json:"application_name"`
	ClientAddr      string     `json:"client_addr"` // empty for a Unix-socket session
	State           string     `json:"state"`
	WaitStart       time.Time  `json:"waitstart"`
	WaitedSeconds   float64    `json:"waited_seconds"`
	BackendStart    *time.Time `json:"backend_start"`
	// HeldBy are the pids holding the key when the check ran, Prepared the
	// GIDs of prepared transactions holding it (they have no pid).
	HeldBy   []int32  `json:"held_by"`
	Prepared []string `json:"prepared"`
}

// runCheck queries the leases, the blocked takeovers, the lock waits and
// the unguarded tables. It reads only; ctx bounds each query.
func runCheck(ctx context.Context, pool *pgxpool.Pool, maxHold, maxWait time.Duration) (*checkReport, error) {
	rep := &checkReport{
		MaxHoldSeconds: maxHold.Seconds(),
		MaxWaitSeconds: maxWait.Seconds(),
		Leases:         []leaseRow{},
		LockWaits:      []longWait{},
		Unguarded:      []unguardedTable{},
	}
	rows, err := pool.Query(ctx, sqlLongLeases, maxHold)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list long-held leases: %w", err))
	}
	for rows.Next() {
		var l leaseRow
		if err := rows.Scan(&l.Name, &l.Owner, &l.Fence, &l.AcquiredAt, &l.RenewedAt, &l.ExpiresAt,
			&l.Expired, &l.ExpiresInSeconds, &l.HeldForSeconds, &l.Data); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read long-held leases: %w", err)
		}
		rep.Leases = append(rep.Leases, l)
	}
	if err := rows.Err(); err != nil {
		return nil, schemaHint(fmt.Errorf("read long-held leases: %w", err))
	}

	brows, err := pool.Query(ctx, sqlBlockedTakeovers, maxWait)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list blocked lease takeovers: %w", err))
	}
	rep.BlockedTakeovers, err = pgx.CollectRows(brows, pgx.RowToStructByPos[blockedTakeover])
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list blocked lease takeovers: %w", err))
	}

	locks, err := listLocks(ctx, pool)
	if err != nil {
		return nil, err
	}
	rep.LockWaits = longWaits(locks, maxWait)

	urows, err := pool.Query(ctx, sqlUnguarded)
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list unguarded tables: %w", err))
	}
	tables, err := pgx.CollectRows(urows, pgx.RowToStructByPos[unguardedTable])
	if err != nil {
		return nil, schemaHint(fmt.Errorf("list unguarded tables: %w", err))
	}
	rep.Unguarded = append(rep.Unguarded, tables...)
	rep.OK = len(rep.Leases) == 0 && len(rep.LockWaits) == 0 && len(rep.Unguarded) == 0 && len(rep.BlockedTakeovers) == 0
	return rep, nil
}

// longWaits picks from a locks ls listing the waiters whose wait started
// longer than maxWait before the listing's clock, with the pids holding
// their key. Waiters without a wait start (before PostgreSQL 14, or for a
// moment after the wait began) are not judged.
func longWaits(locks []lockRow, maxWait time.Duration) []longWait {
	holders := map[int64][]int32{}
	prepared := map[int64][]string{}
	for _, r := range locks {
		switch {
		case r.Granted && r.GID != "":
			prepared[r.Key] = append(prepared[r.Key], r.GID)
		case r.Granted:
			holders[r.Key] = append(holders[r.Key], r.PID)
		}
	}
	out := []longWait{}
	for _, r := range locks {
		if r.Granted || r.Since == nil || r.SinceSeconds == nil || *r.SinceSeconds <= maxWait.Seconds() {
			continue
		}
		out = append(out, longWait{
			Key: r.Key, Mode: r.Mode, PID: r.PID,
			ApplicationName: r.ApplicationName, ClientAddr: r.ClientAddr, State: r.State,
			WaitStart: *r.Since, WaitedSeconds: *r.SinceSeconds, BackendStart: r.BackendStart,
			HeldBy: append([]int32{}, holders[r.Key]...), Prepared: append([]string{}, prepared[r.Key]...),
		})
	}
	return out
}

// printCheck writes the status line, then the findings as tables.
func printCheck(cmd *cobra.Command, rep *checkReport, maxHold, maxWait time.Duration) error {
	w := cmd.OutOrStdout()
	if rep.OK {
		fmt.Fprintf(w, "OK: no lease held longer than %s, no advisory lock waited on longer than %s\n", maxHold, maxWait)
		return nil
	}
	unguarded := ""
	if len(rep.Unguarded) > 0 {
		unguarded = ", " + plural(len(rep.Unguarded), "table", "tables") + " below a protected table unguarded (run pgfence.protect on the parent again)"
	}
	blocked := ""
	if len(rep.BlockedTakeovers) > 0 {
		blocked = ", " + plural(len(rep.BlockedTakeovers), "lease takeover", "lease takeovers") + " waiting longer than " + maxWait.String() + " for the former holder's fenced transactions"
	}
	fmt.Fprintf(w, "CRITICAL: %s held longer than %s, %s waited on longer than %s%s%s\n",
		plural(len(rep.Leases), "lease", "leases"), maxHold,
		plural(len(rep.LockWaits), "advisory lock", "advisory locks"), maxWait, blocked, unguarded)
	if len(rep.BlockedTakeovers) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "BLOCKED LEASE\tWAITED\tPID\tAPPLICATION\tCLIENT\tHELD BY\tPREPARED")
		for _, b := range rep.BlockedTakeovers {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", orDash(display(b.Lease)), human(seconds(b.WaitedSeconds)), b.PID,
				orDash(b.ApplicationName), clientOrLocal(b.ClientAddr), orDash(joinPIDs(b.HeldBy)), orDash(quotedList(b.Prepared)))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Unguarded) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "UNGUARDED TABLE	PROTECTED PARENT	MISSING")
		for _, u := range rep.Unguarded {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", display(u.Table), display(u.Parent), u.Missing)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Leases) > 0 {
		fmt.Fprintln(w)
		if err := printLeases(cmd, rep.Leases); err != nil {
			return err
		}
	}
	if len(rep.LockWaits) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "LOCK KEY\tMODE\tWAITED\tPID\tAPPLICATION\tCLIENT\tHELD BY\tPREPARED")
		for _, l := range rep.LockWaits {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.Key, l.Mode, human(seconds(l.WaitedSeconds)),
				l.PID, orDash(l.ApplicationName), clientOrLocal(l.ClientAddr), orDash(joinPIDs(l.HeldBy)), orDash(quotedList(l.Prepared)))
		}
		return tw.Flush()
	}
	return nil
}

// clientOrLocal is a client address, or "local" for a Unix socket.
func clientOrLocal(addr string) string {
	if addr == "" {
		return "local"
	}
	return addr
}

// joinPIDs is "1,2,3".
func joinPIDs(pids []int32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

// quotedList is each string Go-quoted, comma-separated: GIDs are anyone's
// text.
func quotedList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ",")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
