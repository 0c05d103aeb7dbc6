package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/pglock"
)

// runEnvLine is what the test children print: the lease and fence run
// handed them.
var runEnvLine = regexp.MustCompile(`^(\S+) (\d+)$`)

func parseEnvLine(t *testing.T, line, lease string) int64 {
	t.Helper()
	m := runEnvLine.FindStringSubmatch(line)
	if m == nil || m[1] != lease {
		t.Fatalf("child printed %q, want %q and a fence", line, lease+" <fence>")
	}
	f, _ := strconv.ParseInt(m[2], 10, 64)
	if f <= 0 {
		t.Fatalf("PGFENCE_FENCE = %d, want > 0", f)
	}
	return f
}

// Two runs of one lease never overlap: with --no-wait the second exits 75
// naming the holder; without, it waits and then runs with a higher fence.
func TestRunLeaseExcludes(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	marker := filepath.Join(t.TempDir(), "running")
	env := cliEnv("DATABASE_URL="+url, "MARKER="+marker)

	// The first holder marks that it runs and waits for its stdin to close.
	first := startCLI(t, env, "run", "--lease", "job", "--ttl", "3s", "--",
		"sh", "-c", `touch "$MARKER"; echo "$PGFENCE_LEASE $PGFENCE_FENCE"; cat >/dev/null; rm "$MARKER"`)
	fence1 := parseEnvLine(t, first.line(), "job")

	r := cli(t, env, "run", "--lease", "job", "--ttl", "3s", "--no-wait", "--", "sh", "-c", "echo ran")
	if r.code != exitHeld {
		t.Errorf("--no-wait on a held lease: exit %d, want %d", r.code, exitHeld)
	}
	if r.stdout != "" {
		t.Errorf("--no-wait on a held lease ran the command: stdout %q", r.stdout)
	}
	host, _ := os.Hostname()
	for _, want := range []string{`lease "job" is held by ` + host + "/", "fence " + strconv.FormatInt(fence1, 10), "expires in"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("--no-wait stderr %q does not say %q", r.stderr, want)
		}
	}

	// A waiting run: its child fails if the first child is still running.
	second := startCLI(t, env, "run", "--lease", "job", "--ttl", "3s", "--",
		"sh", "-c", `test ! -e "$MARKER" && echo "$PGFENCE_LEASE $PGFENCE_FENCE"`)
	if err := first.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	if code := first.wait(); code != 0 {
		t.Fatalf("first run: exit %d", code)
	}
	fence2 := parseEnvLine(t, second.line(), "job")
	if code := second.wait(); code != 0 {
		t.Fatalf("waiting run: exit %d (its command ran while the first still held the lease?)", code)
	}
	if fence2 <= fence1 {
		t.Errorf("second grant's fence %d is not above the first's %d", fence2, fence1)
	}
}

// run exits with its command's status, 128+N for death by signal N, and
// 127 for a command that does not exist (without taking the lease).
func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"sh", "-c", "exit 0"}, 0},
		{[]string{"sh", "-c", "exit 7"}, 7},
		{[]string{"sh", "-c", "kill -TERM $$"}, 128 + 15},
		{[]string{"sh", "-c", "kill -USR1 $$"}, 128 + 10},
		{[]string{"pgfence-no-such-command"}, exitNotFound},
	}
	for _, tc := range cases {
		r := db(t, url, append([]string{"run", "--lease", "status", "--ttl", "2s", "--"}, tc.args...)...)
		if r.code != tc.want {
			t.Errorf("run %v: exit %d, want %d", tc.args, r.code, tc.want)
		}
		r = db(t, url, append([]string{"run", "--lock", "status", "--"}, tc.args...)...)
		if r.code != tc.want {
			t.Errorf("run --lock %v: exit %d, want %d", tc.args, r.code, tc.want)
		}
	}
	if r := db(t, url, "leases", "ls", "--json"); strings.Contains(r.stdout, `"expired": false`) {
		t.Errorf("after the runs, a lease is still held: %s", r.stdout)
	}
}

// A command reads the name and the fence (or key) of its own grant, also
// when pgfence's environment already carries those variables (a nested
// `pgfence run`, a job environment that inherited them): run replaces them
// instead of adding a second entry, which C's getenv and Go's os.Getenv,
// reading the first, would not see: the job would declare another lease's
// token. The command is the test binary (argPrintEnv), a Go program.
func TestRunChildSeesItsOwnGrant(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	key := strconv.FormatInt(pglock.Key("inner"), 10)
	for _, tc := range []struct {
		name string
		args []string
		vars string
		want *regexp.Regexp // the command's entries, one a line
	}{
		{"lease", []string{"run", "--lease", "inner", "--ttl", "10s", "--"}, "PGFENCE_LEASE,PGFENCE_FENCE",
			regexp.MustCompile(`^PGFENCE_LEASE=inner\nPGFENCE_FENCE=([1-9]\d+)\n$`)},
		{"lock", []string{"run", "--lock", "inner", "--"}, "PGFENCE_LOCK,PGFENCE_LOCK_KEY",
			regexp.MustCompile(`^PGFENCE_LOCK=inner\nPGFENCE_LOCK_KEY=(` + regexp.QuoteMeta(key) + `)\n$`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// As under `pgfence run --lease outer` or `--lock outer`.
			env := cliEnv("DATABASE_URL="+url,
				"PGFENCE_LEASE=outer", "PGFENCE_FENCE=1", "PGFENCE_LOCK=outer", "PGFENCE_LOCK_KEY=1")
			r := cli(t, env, slices.Concat(tc.args, []string{self, argPrintEnv, tc.vars})...)
			if r.code != 0 {
				t.Fatalf("exit %d; stderr %q", r.code, r.stderr)
			}
			entries, getenv, _ := strings.Cut(r.stdout, "getenv ")
			m := tc.want.FindStringSubmatch(entries)
			if m == nil {
				t.Fatalf("the command's environment has %q (its getenv reads %q); want exactly one entry of each of %s, its own grant's",
					entries, "getenv "+getenv, tc.vars)
			}
			names := strings.Split(tc.vars, ",")
			want := "getenv " + names[0] + "=inner\ngetenv " + names[1] + "=" + m[1] + "\n"
			if "getenv "+getenv != want {
				t.Errorf("the command's getenv reads %q, want %q", "getenv "+getenv, want)
			}
		})
	}
}

// Signals sent to run reach the command.
func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	p := startCLI(t, cliEnv("DATABASE_URL="+url), "run", "--lease", "signals", "--ttl", "5s", "--",
		"sh", "-c", `trap 'echo got USR1' USR1; trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.05; done`)
	if l := p.line(); l != "ready" {
		t.Fatalf("child printed %q", l)
	}
	_ = p.cmd.Process.Signal(syscall.SIGUSR1)
	if l := p.line(); l != "got USR1" {
		t.Fatalf("after SIGUSR1 the child printed %q", l)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if l := p.line(); l != "got TERM" {
		t.Fatalf("after SIGTERM the child printed %q", l)
	}
	if code := p.wait(); code != 3 {
		t.Fatalf("exit %d, want the child's 3", code)
	}
}

// Force-releasing the lease stops the command: SIGTERM, and SIGKILL after
// --grace when it ignores SIGTERM; pgfence then exits with the command's
// status, or 1 if that says success.
func TestRunStopsCommandWhenLeaseLost(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		script string
		grace  time.Duration
		want   int
	}{
		{"obeys SIGTERM", `echo ready; exec sleep 60`, 1500 * time.Millisecond, 128 + 15},
		{"ignores SIGTERM", `trap '' TERM; echo ready; while :; do sleep 0.05; done`, time.Second, 128 + 9},
		// A command that handles SIGTERM and exits 0 did not finish its
		// work under the lease: pgfence does not report success.
		{"exits 0 on SIGTERM", `trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done`, 1500 * time.Millisecond, exitFailure},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := pgtest.URL(t)
			p := startCLI(t, cliEnv("DATABASE_URL="+url), "run", "--lease", "victim", "--ttl", "3s",
				"--grace", tc.grace.String(), "--", "sh", "-c", tc.script)
			if l := p.line(); l != "ready" {
				t.Fatalf("child printed %q", l)
			}
			released := time.Now()
			if r := db(t, url, "leases", "release", "--force", "victim"); r.code != 0 {
				t.Fatalf("release --force: exit %d", r.code)
			}
			code := p.wait()
			elapsed := time.Since(released)
			if code != tc.want {
				t.Errorf("exit %d, want %d", code, tc.want)
			}
			if !strings.Contains(p.stderr.String(), `lease "victim"`) || !strings.Contains(p.stderr.String(), "lost") {
				t.Errorf("stderr %q does not report the loss", p.stderr)
			}
			// Loss is noticed at the next renewal (every TTL/3 = 1s);
			// SIGKILL comes --grace after that, so never sooner than grace
			// after the release. The upper bound only catches a hang.
			if tc.want == 128+9 && elapsed < tc.grace {
				t.Errorf("SIGKILL %s after the release, before the %s grace", elapsed, tc.grace)
			}
			if elapsed > 20*time.Second {
				t.Errorf("the command stopped %s after the release", elapsed)
			}
		})
	}
}

// A --grace that would outlast the lease's local deadline is refused; the
// default is cut to TTL/2. (The URL points nowhere: a run that got past
// validation exits 69.)
func TestRunGraceMustFitTheLease(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"--ttl", "5s", "--grace", "3s"}, exitUsage},
		{[]string{"--ttl", "1m", "--grace", "31s"}, exitUsage},
		{[]string{"--ttl", "5s", "--grace", "2500ms"}, exitUnavailable},
		{[]string{"--ttl", "1s"}, exitUnavailable}, // the default 10s, cut to 500ms
	}
	for _, tc := range cases {
		args := append(append([]string{"run", "--lease", "job"}, tc.args...), "--", "true")
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), args...)
		if r.code != tc.want {
			t.Errorf("%v: exit %d, want %d", tc.args, r.code, tc.want)
		}
		if tc.want == exitUsage && !strings.Contains(r.stderr, "--grace must be at most TTL/2") {
			t.Errorf("%v: stderr %q does not state the rule", tc.args, r.stderr)
		}
	}
	if r := cli(t, cliEnv(), "run", "--help"); !strings.Contains(r.stdout, "deadline = start of the last successful renewal + TTL - TTL/10") {
		t.Errorf("run --help does not state the timing rule:\n%s", r.stdout)
	}
}

// Processes the command leaves behind do not run on without the lease:
// they get SIGTERM when the command exits, before the release.
func TestRunStopsLeftovers(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	tr := newTree(t)
	r := db(t, url, "run", "--lease", "leftovers", "--ttl", "3s", "--", "sh", "-c", `sleep "$0" & setsid sleep "$0" & echo started`, tr.tok)
	if r.code != 0 {
		t.Errorf("exit %d, want the command's 0", r.code)
	}
	if !strings.Contains(r.stderr, "the command exited and left 2 processes running") {
		t.Errorf("stderr %q does not report the leftovers", r.stderr)
	}
	if pids := tr.alive(); len(pids) > 0 {
		_ = syscall.Kill(pids[0], syscall.SIGKILL)
		t.Errorf("left-over processes still run after pgfence exited: %v", pids)
	}
}

// A command that pgfence stops because the lease could not be renewed
// before its local deadline (here: the network to the database goes
// silent) and that exits 0 on SIGTERM did not finish its work under the
// lease: run exits 1, as after a force-release, not 0. Only the reaper
// knows: it sends SIGTERM at deadline − grace, while the leases package
// still counts the lease as held (until the deadline, grace later), and
// the command is gone long before that. --grace 4s leaves that margin wide
// enough for a loaded machine (a race-enabled binary alone takes 1s to
// exit).
func TestRunStoppedAtTheDeadlineIsNoSuccess(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	px, viaProxy := startSilentProxy(t, url)
	p := startCLI(t, cliEnv("DATABASE_URL="+viaProxy), "run", "--lease", "cut-short", "--ttl", "10s", "--grace", "4s", "--",
		"sh", "-c", `trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	if l := p.line(); l != "ready" {
		t.Fatalf("child printed %q", l)
	}
	px.Silence()
	if l := p.line(); l != "got TERM" {
		t.Fatalf("after the cut the child printed %q, want %q", l, "got TERM")
	}
	if code := p.wait(); code != exitFailure {
		t.Errorf("exit %d, want %d: the command was stopped before the lease's local deadline, its work cut short", code, exitFailure)
	}
	if !strings.Contains(p.stderr.String(), "exited 0 after") {
		t.Errorf("stderr %q does not say why the exit status is 1", p.stderr)
	}
}

// SIGINT, SIGTERM and SIGHUP abandon a run before its command starts,
// also once the lease is granted: here --once's read of its period waits
// behind an operator's lock on pgfence.once (as it would on a server
// frozen or cut off), and Ctrl-C must still end pgfence, exiting 128+N
// without running the command, rather than leave it holding the lease.
func TestRunInterruptedBeforeTheCommandStarts(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	pool := pgtest.PoolFor(t, url)
	locker, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Release)
	for _, q := range []string{`BEGIN`, `LOCK TABLE pgfence.once IN ACCESS EXCLUSIVE MODE`} {
		if _, err := locker.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = locker.Exec(ctx, `ROLLBACK`) })
	p := startCLI(t, cliEnv("DATABASE_URL="+url), "run", "--lease", "interrupted", "--ttl", "5s", "--once", "p1", "--", "sh", "-c", "echo ran")
	pgtest.WaitFor(t, cliTimeout, "run to wait for its period's record", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'pgfence run' AND wait_event_type = 'Lock' AND query LIKE '%pgfence.once%'
			  AND datname = current_database()`).Scan(&n)
		return err == nil && n > 0
	})
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	// It should take well under a second; a minute allows for a loaded
	// machine, and fails the test rather than hang it until the lock ends.
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		t.Fatalf("pgfence still runs a minute after SIGINT; stderr:\n%s", p.stderr)
	}
	if code := p.wait(); code != 128+int(syscall.SIGINT) {
		t.Errorf("exit %d, want %d", code, 128+int(syscall.SIGINT))
	}
	if !strings.Contains(p.stderr.String(), "the command did not run") {
		t.Errorf("stderr %q does not say that the command did not run", p.stderr)
	}
}

// The record of --once's period, after the command exited 0, is bounded
// as a one-shot command's statements are (answerTimeout): a database that
// stops answering then (here the record waits behind an operator's lock on
// pgfence.once, as it would on a frozen server) must not leave pgfence
// hanging for good — holding the lease all the while, its keepalive
// renewing it — but exit 1, the period left to the next run.
func TestRunOnceRecordDoesNotHang(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	pool := pgtest.PoolFor(t, url)
	p := startCLI(t, cliEnv("DATABASE_URL="+url), "run", "--lease", "record-stuck", "--ttl", "5s", "--once", "p1", "--",
		"sh", "-c", "echo ready; cat >/dev/null")
	if l := p.line(); l != "ready" {
		t.Fatalf("child printed %q", l)
	}
	locker, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Release)
	for _, q := range []string{`BEGIN`, `LOCK TABLE pgfence.once IN ACCESS EXCLUSIVE MODE`} {
		if _, err := locker.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = locker.Exec(ctx, `ROLLBACK`) })
	if err := p.stdin.Close(); err != nil {
		t.Fatal(err)
	}
	exited := time.Now()
	// The bound, plus a minute for a loaded machine; the test fails
	// rather than hang until the lock ends.
	select {
	case <-p.done:
	case <-time.After(answerTimeout + time.Minute):
		t.Fatalf("pgfence still runs %s after its command exited; stderr:\n%s", time.Since(exited).Round(time.Second), p.stderr)
	}
	if code := p.wait(); code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	if !strings.Contains(p.stderr.String(), "could not be recorded") {
		t.Errorf("stderr %q does not say that the period was not recorded", p.stderr)
	}
}

// After the network to the database goes silent, run exits soon after its
// command: the release after the command is bounded by releaseTimeout,
// and nothing after it (the leases client's retry of a failed release,
// closing the connections, whose cancelled statements pgx cleans up for
// up to 15s) may keep pgfence, which is about to exit anyway, for longer.
func TestRunPartitionedExitsSoonAfterTheCommand(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	px, viaProxy := startSilentProxy(t, url)
	p := startCLI(t, cliEnv("DATABASE_URL="+viaProxy), "run", "--lease", "cut-off", "--ttl", "3s", "--grace", "1s", "--",
		"sh", "-c", `trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.05; done`)
	if l := p.line(); l != "ready" {
		t.Fatalf("child printed %q", l)
	}
	px.Silence()
	if l := p.line(); l != "got TERM" {
		t.Fatalf("after the cut the child printed %q, want %q", l, "got TERM")
	}
	ended := time.Now()
	code := p.wait()
	took := time.Since(ended)
	t.Logf("pgfence exited %s after its command", took.Round(time.Millisecond))
	if code != 3 {
		t.Errorf("exit %d, want the command's 3", code)
	}
	// releaseTimeout, plus 5s for a loaded machine (a race-enabled binary
	// alone takes a second to exit); before the bound it took 15s.
	if took > releaseTimeout+5*time.Second {
		t.Errorf("pgfence exited %s after its command, want within about %s", took.Round(time.Millisecond), releaseTimeout)
	}
}

// A process whose main thread has exited while its other threads run
// (pthread_exit in a C program's main) shows as a zombie in /proc, yet
// lives: the reaper must count and kill it as any process the command
// left running, or wait for it for good, run never exiting.
func TestRunStopsAProcessWhoseMainThreadExited(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := startCLI(t, cliEnv("DATABASE_URL="+url), "run", "--lease", "zombie-leader", "--ttl", "3s", "--grace", "1s", "--",
		"sh", "-c", `"$0" `+argZombieLeader+` >/dev/null &
until [ "$(cut -d' ' -f3 /proc/$!/stat)" = Z ]; do sleep 0.01; done
echo $!`, self)
	pid, err := strconv.Atoi(p.line())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	// It should take about a second; a minute allows for a loaded machine.
	select {
	case <-p.done:
	case <-time.After(time.Minute):
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		t.Fatalf("pgfence still runs a minute after its command exited, the leftover process %q alive; stderr:\n%s", b, p.stderr)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("exit %d, want the command's 0", code)
	}
	if !strings.Contains(p.stderr.String(), "the command exited and left 1 processes running") {
		t.Errorf("stderr %q does not report the leftover", p.stderr)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("the leftover process %d still exists after pgfence exited", pid)
	}
}

// SIGTERM reaches run while its renewal is stuck (here behind a row lock
// on the lease, as behind a slow server) and completes late, after the
// command has exited: run passes on the command's status, says nothing of
// a loss, and releases the lease once — the next run is granted it at
// once, with a higher fence, rather than after the TTL.
func TestRunSIGTERMDuringALateRenewal(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	pool := pgtest.PoolFor(t, url)
	p := startCLI(t, cliEnv("DATABASE_URL="+url), "run", "--lease", "late", "--ttl", "30s", "--",
		"sh", "-c", `trap 'echo got TERM; exit 3' TERM; echo "$PGFENCE_FENCE"; while :; do sleep 0.05; done`)
	fence, err := strconv.ParseInt(p.line(), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = blocker.Rollback(ctx) })
	if _, err := blocker.Exec(ctx, `SELECT FROM pgfence.leases WHERE name = 'late' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// A renewal comes every TTL/3 = 10s at most.
	pgtest.WaitFor(t, cliTimeout, "a renewal to wait for the row lock", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'pgfence run' AND wait_event_type = 'Lock'
			  AND datname = current_database()`).Scan(&n)
		return err == nil && n > 0
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if l := p.line(); l != "got TERM" {
		t.Fatalf("after SIGTERM the command printed %q", l)
	}
	if err := blocker.Rollback(ctx); err != nil { // the renewal goes through, late
		t.Fatal(err)
	}
	if code := p.wait(); code != 3 {
		t.Errorf("exit %d, want the command's 3", code)
	}
	if s := p.stderr.String(); strings.Contains(s, "lost") {
		t.Errorf("stderr reports a loss: %q", s)
	}
	var released bool
	if err := pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = 'late'`).Scan(&released); err != nil {
		t.Fatal(err)
	}
	if !released {
		t.Errorf("the lease is still held after run exited")
	}
	r := db(t, url, "run", "--lease", "late", "--ttl", "30s", "--no-wait", "--", "sh", "-c", `echo "$PGFENCE_FENCE"`)
	if next, _ := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); r.code != 0 || next <= fence {
		t.Errorf("the next run: exit %d, fence %q; want 0 and a fence above %d", r.code, r.stdout, fence)
	}
}
