package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// These tests hold a lease with one pgfence run (A) whose command is a
// process tree that ignores SIGTERM, one process of it in a session of its
// own, then fault A — a silent network, SIGSTOP, SIGKILL — while a second
// run (B) waits for the lease. B's command looks, the moment it starts,
// for any process of A's tree still alive: "clean" or "overlap".

// tree is a command for pgfence run: a shell that starts a pipeline of two
// sleeps and a third sleep in a new session (setsid: outside the command's
// process group), all ignoring SIGTERM; the shell itself reports SIGTERM
// ("got TERM") and runs on. Every process of the tree has tok as an
// argument, so that it can be found in /proc.
type tree struct{ tok string }

const treeScript = `trap '' TERM
sleep "$0" | sleep "$0" &
setsid sleep "$0" &
trap 'echo got TERM' TERM
echo ready
while :; do sleep 0.1; done`

// treeSize is the number of processes of a tree that carry its token.
const treeSize = 4

// newTree makes a tree with a fresh token. The tree and its checker need
// setsid (util-linux) and pgrep (procps).
func newTree(t *testing.T) *tree {
	t.Helper()
	for _, tool := range []string{"setsid", "pgrep", "sleep"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed for this test: %v", tool, err)
		}
	}
	return &tree{tok: fmt.Sprintf("%d.%06d", 3000+rand.IntN(1000), rand.IntN(1_000_000))}
}

// command is the tree's command line.
func (tr *tree) command() []string { return []string{"sh", "-c", treeScript, tr.tok} }

// checker is a command line that prints "overlap" if any process of the
// tree is alive when it runs, else "clean". (The bracket keeps the pattern
// from matching the checker's own command line; pgrep leaves itself out.)
func (tr *tree) checker() []string {
	pattern := `^(sh|sleep) (.* )?[` + tr.tok[:1] + `]` + regexp.QuoteMeta(tr.tok[1:]) + `( |$)`
	return []string{"sh", "-c", `pgrep -f "$0" >/dev/null; case $? in 0) echo overlap;; 1) echo clean;; *) echo "pgrep failed";; esac`, pattern}
}

// alive lists the live (not zombie) processes of the tree.
func (tr *tree) alive() []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*") // the pattern is valid
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/cmdline") // empty for a zombie
		if err != nil {
			continue // exited meanwhile
		}
		argv := bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0})
		if name := string(argv[0]); name != "sh" && name != "sleep" {
			continue // pgfence's own command line has the token too
		}
		for _, a := range argv[1:] {
			if string(a) == tr.tok {
				pid, _ := strconv.Atoi(filepath.Base(d))
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// startA starts run (A) with the tree as its command and waits until the
// whole tree runs.
func (tr *tree) startA(t *testing.T, url string, runArgs ...string) *proc {
	t.Helper()
	a := startCLI(t, cliEnv("DATABASE_URL="+url), append(append([]string{"run"}, runArgs...), append([]string{"--"}, tr.command()...)...)...)
	// Before A is waited for (cleanups run last first): what is left of
	// the tree holds A's stdout open.
	t.Cleanup(func() {
		if pids := tr.alive(); len(pids) > 0 {
			t.Errorf("processes of A's command outlived the test: %v", pids)
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if l := a.line(); l != "ready" {
		t.Fatalf("A's command printed %q", l)
	}
	pgtest.WaitFor(t, cliTimeout, "the whole tree to run", func() bool { return len(tr.alive()) == treeSize })
	return a
}

// startB starts run (B) with the checker as its command, waiting for the
// lease.
func (tr *tree) startB(t *testing.T, url string, runArgs ...string) *proc {
	t.Helper()
	return startCLI(t, cliEnv("DATABASE_URL="+url), append(append([]string{"run"}, runArgs...), append([]string{"--"}, tr.checker()...)...)...)
}

// killedA is A's exit status when the reaper killed its command.
const killedA = 128 + int(syscall.SIGKILL)

// watchDeath reports when the last process of the tree has died (polling:
// nothing announces it). It is for the log: B's verdict is the test.
func (tr *tree) watchDeath(t *testing.T) <-chan time.Time {
	died, stop, done := make(chan time.Time, 1), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for len(tr.alive()) > 0 {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		died <- time.Now()
	}()
	t.Cleanup(func() { close(stop); <-done })
	return died
}

// expectClean waits for B's verdict, and logs when A's tree died and B's
// command ran, counted from the fault.
func expectClean(t *testing.T, b *proc, fault time.Time, died <-chan time.Time) {
	t.Helper()
	if l := b.line(); l != "clean" {
		t.Errorf("B's command found A's command still running: %q", l)
	}
	ran := time.Since(fault)
	select {
	case d := <-died:
		t.Logf("after the fault: A's command tree dead at %s, B's command ran at %s",
			d.Sub(fault).Round(time.Millisecond), ran.Round(time.Millisecond))
	default:
		t.Logf("after the fault: B's command ran at %s", ran.Round(time.Millisecond))
	}
}

// finish waits for A's tree to die and for both runs to exit: A with
// wantA, B (if any) with 0.
func finish(t *testing.T, tr *tree, a, b *proc, wantA int) {
	t.Helper()
	pgtest.WaitFor(t, 30*time.Second, "A's command tree to die", func() bool { return len(tr.alive()) == 0 })
	if b != nil {
		if code := b.wait(); code != 0 {
			t.Errorf("B: exit %d", code)
		}
	}
	if code := a.wait(); code != wantA {
		t.Errorf("A: exit %d, want %d", code, wantA)
	}
}

// A partitioned from the database cannot renew: its command gets SIGTERM
// at the local deadline minus --grace and SIGKILL at the deadline, before
// the lease expires and B is granted it.
func TestRunPartitionedStopsBeforeExpiry(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	px, viaProxy := startSilentProxy(t, url)
	tr := newTree(t)
	a := tr.startA(t, viaProxy, "--lease", "partitioned", "--ttl", "3s", "--grace", "1s")
	died := tr.watchDeath(t)
	px.Silence()
	cut := time.Now()
	b := tr.startB(t, url, "--lease", "partitioned", "--ttl", "3s")
	if l := a.line(); l != "got TERM" {
		t.Fatalf("A's command printed %q, want %q", l, "got TERM")
	}
	// The last renewal began before the cut, so the deadline is at most
	// TTL − TTL/10 = 2.7s after it, SIGTERM 1s earlier. The bound is loose
	// (shared cores); B's verdict is what matters.
	term := time.Since(cut)
	t.Logf("A's command got SIGTERM %s after the cut", term.Round(time.Millisecond))
	if term > 2700*time.Millisecond-time.Second+2*time.Second {
		t.Errorf("SIGTERM came %s after the cut, long after deadline − grace", term)
	}
	expectClean(t, b, cut, died)
	finish(t, tr, a, b, killedA)
}

// A frozen pgfence (SIGSTOP) renews nothing and signals nothing; its
// reaper still kills the command at the local deadline.
func TestRunFrozenStopsBeforeExpiry(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	tr := newTree(t)
	a := tr.startA(t, url, "--lease", "frozen", "--ttl", "2s")
	died := tr.watchDeath(t)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	frozen := time.Now()
	b := tr.startB(t, url, "--lease", "frozen", "--ttl", "2s")
	expectClean(t, b, frozen, died)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	finish(t, tr, a, b, killedA)
}

// SIGKILL of pgfence leaves its command's whole tree to the reaper: with a
// lease, SIGTERM and SIGKILL after --grace (before the lease can expire);
// with a lock, whose session ends with pgfence, SIGKILL at once.
func TestRunKilledTakesTheTreeAlong(t *testing.T) {
	t.Parallel()
	t.Run("lease", func(t *testing.T) {
		t.Parallel()
		url := pgtest.URL(t)
		tr := newTree(t)
		a := tr.startA(t, url, "--lease", "killed", "--ttl", "3s", "--grace", "500ms")
		b := tr.startB(t, url, "--lease", "killed", "--ttl", "3s")
		died := tr.watchDeath(t)
		killed := time.Now()
		if err := a.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		expectClean(t, b, killed, died)
		finish(t, tr, a, b, -1) // A itself died of SIGKILL
	})
	t.Run("lock", func(t *testing.T) {
		t.Parallel()
		url := pgtest.URL(t)
		tr := newTree(t)
		a := tr.startA(t, url, "--lock", "killed")
		killed := time.Now()
		if err := a.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		// The session, and the lock, end with pgfence: the reaper kills at
		// once, with no grace, racing whoever takes the lock next; this
		// bound only says the tree died, not that it won the race.
		finish(t, tr, a, nil, -1)
		t.Logf("the tree died within %s of SIGKILL", time.Since(killed).Round(time.Millisecond))
	})
}
