package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
)

const demoLong = `Watch pgfence keep a periodic job exactly-once while one worker is frozen.

demo starts --workers worker processes (this binary, as 'pgfence demo
worker'). For each of --periods periods they compete for lease
demo/period/<n>; the winner checks the period is not done, works, and writes
the period's row to ` + demoTable + ` through a fenced transaction
(fencing.InTx on a table protected by pgfence.protect).

Midway, the winner of one period is frozen with SIGSTOP after its check and
before its write, and kept frozen until its lease has expired and another
worker has taken over (with a higher fence) and written the period. Then it
gets SIGCONT and writes, as a process that cannot know it was paused would:
the database rejects the write as stale.

demo prints who won each period with which fence, then checks that every
period was done exactly once and that the stale write was rejected (exit 0),
or says what went wrong (exit 3).

With no database configured (no --database-url, DATABASE_URL or PG*
variables) it starts a throwaway PostgreSQL from the server binaries on this
machine (initdb and postgres on PATH or under /usr/lib/postgresql/*/bin),
applies the migrations, and removes it afterwards. On a configured database,
the schema pgfence must be migrated; demo drops and recreates the schema
pgfence_demo.`

type demoOptions struct {
	workers, periods int
	ttl, work        time.Duration
}

// demoTimeout bounds a whole demo run, so that a wedged worker cannot hang
// it: generous for the defaults, which take seconds.
const demoTimeout = 5 * time.Minute

// The demo's timing flags, bounded so that a run fits in demoTimeout: the
// frozen worker is kept frozen for about --ttl, and every period takes
// --work. demo worker takes the same bounds.
const (
	maxDemoTTL  = time.Minute
	maxDemoWork = 10 * time.Second
)

// validDemoTiming checks --ttl and --work of demo and demo worker.
func validDemoTiming(ttl, work time.Duration) error {
	switch {
	case ttl < leases.MinTTL || ttl > maxDemoTTL:
		return usageErrorf("--ttl must be between %s and %s, got %s", leases.MinTTL, maxDemoTTL, ttl)
	case work < 0 || work > maxDemoWork:
		return usageErrorf("--work must be between 0s and %s, got %s", maxDemoWork, work)
	}
	return nil
}

func newDemoCmd(g *globals) *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo [--workers 5] [--periods 10]",
		Short: "Worker processes compete for a lease per period; a frozen one is fenced off",
		Long:  demoLong,
		Args:  argsUsage(cobra.NoArgs),
		RunE: action(func(cmd *cobra.Command, _ []string) error {
			switch {
			case o.workers < 2 || o.workers > 50:
				return usageErrorf("--workers must be between 2 and 50 (one is frozen, another must take over), got %d", o.workers)
			case o.periods < 1 || o.periods > 1000:
				return usageErrorf("--periods must be between 1 and 1000, got %d", o.periods)
			}
			if err := validDemoTiming(o.ttl, o.work); err != nil {
				return err
			}
			// Each period takes --work at least, the frozen one --ttl and
			// --work more (its successor works too).
			if least := time.Duration(o.periods+1)*o.work + o.ttl; least > demoTimeout/2 {
				return usageErrorf("--periods %d with --work %s and --ttl %s would take at least %s; the demo gives up after %s: "+
					"lower --periods or --work", o.periods, o.work, o.ttl, least, demoTimeout)
			}
			return runDemo(cmd, g, o)
		}),
	}
	f := cmd.Flags()
	f.IntVar(&o.workers, "workers", 5, "worker processes (2 to 50)")
	f.IntVar(&o.periods, "periods", 10, "periods (1 to 1000)")
	f.DurationVar(&o.ttl, "ttl", 2*time.Second, fmt.Sprintf("lease TTL: how long the frozen worker's lease outlives its last renewal (%s to %s)", leases.MinTTL, maxDemoTTL))
	f.DurationVar(&o.work, "work", 50*time.Millisecond, fmt.Sprintf("simulated work per period (0s to %s)", maxDemoWork))
	cmd.AddCommand(newDemoWorkerCmd(g))
	return cmd
}

func runDemo(cmd *cobra.Command, g *globals, o demoOptions) error {
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, demoTimeout)
	defer cancel()
	out := cmd.OutOrStdout()

	connString := g.connString()
	if !g.configured() {
		c, err := pgcluster.New()
		if err != nil {
			return fmt.Errorf("no database configured (--database-url, DATABASE_URL or PG* variables), and no throwaway PostgreSQL could be started: %w", err)
		}
		defer c.Close()
		connString = c.URL("postgres")
		fmt.Fprintf(out, "no database configured: started a throwaway PostgreSQL on 127.0.0.1:%d (removed at exit)\n", c.Port())
		if err := migrations.Up(ctx, connString); err != nil {
			return fmt.Errorf("migrate the throwaway database: %w", err)
		}
	}
	pool, err := openSchemaPool(ctx, connString, "pgfence demo", 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := setupDemo(ctx, pool, true); err != nil {
		return err
	}

	pause := (o.periods + 1) / 2
	fmt.Fprintf(out, "%d workers compete for lease demo/period/<n> (TTL %s) in each of %d periods;\nthe winner of period %d is frozen (SIGSTOP) between its check and its write.\n\n",
		o.workers, o.ttl, o.periods, pause)
	d := &demo{o: o, out: out, pause: pause, wrote: map[int][]demoEvent{}}
	if err := d.run(ctx, connString); err != nil {
		return err
	}
	return d.check(ctx, pool)
}

// demo is the parent's state while workers run.
type demo struct {
	o          demoOptions
	out        io.Writer
	pause      int // the period whose winner is frozen
	workers    map[string]*demoProc
	started    int  // workers connected and waiting for the start
	startedAll bool // the start has been given

	frozen    *demoProc // the frozen worker, until resumed
	frozenEv  demoEvent
	resumed   bool
	wrote     map[int][]demoEvent
	stale     []demoEvent
	failures  []string
	exitCodes map[string]int
}

type demoProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

type procLine struct {
	p   *demoProc
	ev  demoEvent
	eof bool
	err error
}

// run starts the workers and drives them until all have exited.
func (d *demo) run(ctx context.Context, connString string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this executable to start workers: %w", err)
	}
	lines := make(chan procLine)
	d.workers = map[string]*demoProc{}
	d.exitCodes = map[string]int{}
	var procs []*demoProc
	defer func() { // on any early return, no worker outlives the demo
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGCONT)
				_ = p.cmd.Process.Kill()
			}
		}
	}()
	for i := 1; i <= d.o.workers; i++ {
		name := "w" + strconv.Itoa(i)
		cmd := exec.Command(self, "demo", "worker", "--supervised", "--name", name,
			"--first", "1", "--periods", strconv.Itoa(d.o.periods),
			"--ttl", d.o.ttl.String(), "--work", d.o.work.String())
		cmd.Env = os.Environ()
		if connString != "" {
			cmd.Env = append(cmd.Env, "DATABASE_URL="+connString) // not on the command line, where ps shows it
		}
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return fmt.Errorf("worker %s: %w", name, err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return fmt.Errorf("worker %s: %w", name, err)
		}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start worker %s: %w", name, err)
		}
		p := &demoProc{name: name, cmd: cmd, stdin: stdin}
		procs = append(procs, p)
		d.workers[name] = p
		go readEvents(p, stdout, lines)
	}

	for open := len(procs); open > 0; {
		var l procLine
		select {
		case l = <-lines:
		case <-ctx.Done():
			return fmt.Errorf("demo did not finish: %w", context.Cause(ctx))
		}
		if l.eof {
			open--
			err := l.p.cmd.Wait()
			d.exitCodes[l.p.name] = exitCode(err, l.p.cmd.ProcessState)
			if l.err != nil {
				d.failures = append(d.failures, fmt.Sprintf("worker %s: %v", l.p.name, l.err))
			}
			d.startAll()
			if f := d.frozen; f != nil && open == 1 {
				// Nobody is left to take over: let the frozen worker finish.
				d.failures = append(d.failures, fmt.Sprintf("no worker took over period %d from the frozen %s", d.pause, f.name))
				d.goAhead(f)
				_ = f.cmd.Process.Signal(syscall.SIGCONT)
				d.frozen = nil
			}
			continue
		}
		d.handle(l.p, l.ev)
	}
	return nil
}

// readEvents sends p's events to lines, then one eof line.
func readEvents(p *demoProc, r io.Reader, lines chan<- procLine) {
	sc := bufio.NewScanner(r)
	var err error
	for sc.Scan() {
		var ev demoEvent
		if jerr := json.Unmarshal(sc.Bytes(), &ev); jerr != nil {
			err = fmt.Errorf("unreadable event %q: %w", sc.Text(), jerr)
			continue
		}
		lines <- procLine{p: p, ev: ev}
	}
	if err == nil {
		err = sc.Err()
	}
	lines <- procLine{p: p, eof: true, err: err}
}

func (d *demo) handle(p *demoProc, ev demoEvent) {
	switch ev.Event {
	case "started":
		d.started++
		d.startAll()
	case "ready":
		if ev.Period == d.pause && d.frozen == nil && !d.resumed {
			// Freeze it between its check and its write. Its go-ahead is
			// sent only once another worker has done the period.
			if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				d.failures = append(d.failures, fmt.Sprintf("SIGSTOP %s: %v", p.name, err))
				d.goAhead(p)
				return
			}
			d.frozen, d.frozenEv = p, ev
			fmt.Fprintf(d.out, "period %d: %s holds demo/period/%d (fence %d), found the period not done, and is frozen (SIGSTOP) before writing\n",
				ev.Period, p.name, ev.Period, ev.Fence)
			return
		}
		d.goAhead(p)
	case "wrote":
		d.wrote[ev.Period] = append(d.wrote[ev.Period], ev)
		if d.frozen != nil && ev.Period == d.pause && ev.Worker != d.frozen.name {
			f := d.frozen
			fmt.Fprintf(d.out, "period %d: %s's lease expired; %s took over with fence %d and did the period\n", ev.Period, f.name, ev.Worker, ev.Fence)
			fmt.Fprintf(d.out, "period %d: %s resumed (SIGCONT) and writes with its old fence %d ...\n", ev.Period, f.name, d.frozenEv.Fence)
			d.goAhead(f) // buffered in the pipe until it runs again
			if err := f.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				d.failures = append(d.failures, fmt.Sprintf("SIGCONT %s: %v", f.name, err))
			}
			d.frozen, d.resumed = nil, true
		}
	case "stale":
		d.stale = append(d.stale, ev)
		fmt.Fprintf(d.out, "period %d: %s's write with fence %d was rejected by the database: stale%s\n", ev.Period, ev.Worker, ev.Fence, retried(ev))
	case "lost":
		fmt.Fprintf(d.out, "period %d: %s noticed its lease was lost while working and did not write (%s)\n", ev.Period, ev.Worker, ev.Error)
	case "error":
		d.failures = append(d.failures, fmt.Sprintf("worker %s, period %d: %s", ev.Worker, ev.Period, ev.Error))
	}
}

// startAll lets the workers start once every live one has connected (a
// worker that failed before connecting is not waited for).
func (d *demo) startAll() {
	if d.startedAll || d.started+len(d.exitCodes) < len(d.workers) {
		return
	}
	d.startedAll = true
	for _, w := range d.workers {
		if _, exited := d.exitCodes[w.name]; !exited {
			d.goAhead(w)
		}
	}
}

// retried says how many serialization failures a write was retried after
// (repeatable read, serializable), if any.
func retried(ev demoEvent) string {
	if ev.Retries == 0 {
		return ""
	}
	if ev.Retries == 1 {
		return " (retried after a serialization failure)"
	}
	return fmt.Sprintf(" (retried after %d serialization failures)", ev.Retries)
}

func (d *demo) goAhead(p *demoProc) {
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		d.failures = append(d.failures, fmt.Sprintf("signal %s to write: %v", p.name, err))
	}
}

// check prints the outcome and verifies it: every period has exactly one
// row, written by the one worker that reported writing it, with the fence it
// reported; the frozen worker's write was rejected; every worker exited 0.
func (d *demo) check(ctx context.Context, pool *pgxpool.Pool) error {
	type row struct {
		worker string
		fence  int64
	}
	rows := map[int]row{}
	rs, err := pool.Query(ctx, sqlDemoRows)
	if err != nil {
		return fmt.Errorf("read %s: %w", demoTable, err)
	}
	for rs.Next() {
		var p int
		var r row
		if err := rs.Scan(&p, &r.worker, &r.fence); err != nil {
			rs.Close()
			return fmt.Errorf("read %s: %w", demoTable, err)
		}
		rows[p] = r
	}
	if err := rs.Err(); err != nil {
		return fmt.Errorf("read %s: %w", demoTable, err)
	}

	fmt.Fprintln(d.out)
	tw := tabwriter.NewWriter(d.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PERIOD\tWINNER\tFENCE\tREJECTED")
	failures := d.failures
	for n := 1; n <= d.o.periods; n++ {
		r, ok := rows[n]
		note := ""
		for _, s := range d.stale {
			if s.Period == n {
				note += fmt.Sprintf("%s (stale fence %d) ", s.Worker, s.Fence)
			}
		}
		if !ok {
			fmt.Fprintf(tw, "%d\t-\t-\t%s\n", n, "NOT DONE")
			failures = append(failures, fmt.Sprintf("period %d was not done", n))
			continue
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\n", n, r.worker, r.fence, note)
		switch w := d.wrote[n]; {
		case len(w) != 1:
			failures = append(failures, fmt.Sprintf("period %d: %d workers report writing it", n, len(w)))
		case w[0].Worker != r.worker || w[0].Fence != r.fence:
			failures = append(failures, fmt.Sprintf("period %d: row says %s/fence %d, worker %s reported fence %d", n, r.worker, r.fence, w[0].Worker, w[0].Fence))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rows) != d.o.periods {
		failures = append(failures, fmt.Sprintf("%d rows for %d periods", len(rows), d.o.periods))
	}
	if !d.resumed {
		failures = append(failures, fmt.Sprintf("no worker was frozen and resumed at period %d", d.pause))
	}
	if len(d.stale) != 1 || d.stale[0].Period != d.pause {
		failures = append(failures, fmt.Sprintf("want exactly one stale write rejected, at period %d; got %d", d.pause, len(d.stale)))
	}
	for _, s := range d.stale {
		// The refused write did not land: the period's row is another
		// worker's, written with a later grant's fence.
		if r, ok := rows[s.Period]; !ok || r.worker == s.Worker || r.fence <= s.Fence {
			failures = append(failures, fmt.Sprintf("period %d: %s's write with fence %d was refused, but the table does not show a later grant's row", s.Period, s.Worker, s.Fence))
		}
	}
	for name, code := range d.exitCodes {
		if code != 0 {
			failures = append(failures, fmt.Sprintf("worker %s exited with status %d", name, code))
		}
	}
	fmt.Fprintln(d.out)
	if len(failures) > 0 {
		fmt.Fprintf(d.out, "each period done exactly once: FAILED; stale writes rejected: %d\n", len(d.stale))
		for _, f := range failures {
			fmt.Fprintf(d.out, "  - %s\n", f)
		}
		return &exitError{code: exitCheckFailed, err: errors.New("demo check failed")}
	}
	fmt.Fprintf(d.out, "each period done exactly once: ok; stale writes rejected: %d\n", len(d.stale))
	return nil
}
