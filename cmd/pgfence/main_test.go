package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/gocmd"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// The tests run the CLI as a real process: the test binary re-executes
// itself with envCLI set, and init below turns it into pgfence before the
// testing package starts. (Building the binary with go build would cost a
// link of its own; this reuses the race-enabled test binary, so the CLI's
// own goroutines are race-checked too. `demo` re-executes the same binary
// for its workers, and the variable is inherited, so they work as well.)
const envCLI = "PGFENCE_TEST_RUN_CLI"

// argPrintEnv turns the test binary, run as `pgfence run`'s command (test
// binary -print-env A,B), into a Go program that prints the entries named
// A or B of the environment it was started with (/proc/self/environ:
// os.Environ drops repeated names), one a line and in their order, then
// what os.Getenv says of each (the first entry wins, as with C's getenv).
// It is checked before envCLI, which the command inherits.
const argPrintEnv = "-print-env"

// argZombieLeader turns the test binary into a process whose main thread
// has exited while its other threads run on: its /proc stat says Z (a
// zombie) although the process lives, as a C program's does after
// pthread_exit in main. It prints its pid first. A signal that kills it
// (SIGTERM, SIGKILL) kills all its threads.
const argZombieLeader = "-zombie-leader"

func init() {
	if len(os.Args) == 2 && os.Args[1] == argZombieLeader {
		// The runtime's other threads (sysmon at least) keep the process
		// alive; init runs on the main thread, which exits alone.
		fmt.Println(os.Getpid())
		go func() { time.Sleep(time.Hour) }()
		syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
	}
	if len(os.Args) == 3 && os.Args[1] == argPrintEnv {
		names := strings.Split(os.Args[2], ",")
		environ, err := os.ReadFile("/proc/self/environ")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, kv := range strings.Split(string(environ), "\x00") {
			if k, _, _ := strings.Cut(kv, "="); slices.Contains(names, k) {
				fmt.Println(kv)
			}
		}
		for _, n := range names {
			fmt.Printf("getenv %s=%s\n", n, os.Getenv(n))
		}
		os.Exit(0)
	}
	if os.Getenv(envCLI) == "1" {
		os.Exit(execute(os.Args[1:]))
	}
}

func TestMain(m *testing.M) { pgtest.Main(m) }

// unreachableURL points at a port nothing listens on: a command that gets
// as far as connecting fails with exit 69, not 2.
const unreachableURL = "postgres://nobody@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=5"

// cliTimeout bounds any one CLI invocation in the tests; generous because
// two shared cores run several engineers' tests at once.
const cliTimeout = 2 * time.Minute

type result struct {
	stdout, stderr string
	code           int
}

// cliEnv is the environment of a CLI process: ours without any database
// settings, plus extra.
func cliEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "DATABASE_URL" || isLibpqEnv(k) {
			continue
		}
		env = append(env, kv)
	}
	return append(append(env, envCLI+"=1", gocmd.QuickExit()), extra...)
}

func isLibpqEnv(k string) bool {
	for _, v := range libpqEnv {
		if k == v {
			return true
		}
	}
	return false
}

func cliCommand(ctx context.Context, t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = env
	return cmd
}

// cli runs pgfence with args to completion.
func cli(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := cliCommand(ctx, t, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("pgfence %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("pgfence %v did not finish within %s; stderr:\n%s", args, cliTimeout, r.stderr)
	}
	shown := make([]string, len(args)) // a test's hostile names stay out of the log as they are
	for i, a := range args {
		shown[i] = display(a)
	}
	if passwordShown(r.stdout+r.stderr, slices.Concat(args, env)) {
		// Not logged: the output shows it.
		t.Errorf("pgfence %s => %d printed the password of a URL it was given", strings.Join(shown, " "), r.code)
		return r
	}
	t.Logf("pgfence %s => %d\nstdout:\n%s\nstderr:\n%s", strings.Join(shown, " "), r.code, r.stdout, r.stderr)
	return r
}

// passwordShown reports whether out contains the password of a URL among
// args (an argument, or the value of a KEY=value environment entry). Only
// passwords of 12 bytes or more count — the random ones of the test
// roles and of a server that asks for one (.ci/run) —, so that a short
// one cannot match text the output has anyway; TestOutputHidesThePassword
// checks every piece of chosen ones.
func passwordShown(out string, args []string) bool {
	for _, a := range args {
		if _, v, ok := strings.Cut(a, "="); ok && !strings.Contains(a[:len(a)-len(v)], "://") {
			a = v
		}
		u, err := url.Parse(a)
		if err != nil || u.User == nil {
			continue
		}
		pw, _ := u.User.Password()
		_, raw, _ := strings.Cut(strings.TrimPrefix(u.User.String(), u.User.Username()), ":") // as escaped
		for _, p := range []string{pw, raw} {
			if len(p) >= 12 && strings.Contains(out, p) {
				return true
			}
		}
	}
	return false
}

// db runs pgfence --database-url url args.
func db(t *testing.T, url string, args ...string) result {
	t.Helper()
	return cli(t, cliEnv(), append([]string{"--database-url", url}, args...)...)
}

// proc is a pgfence process running in the background.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // stdout, line by line; closed at EOF
	stderr *syncBuffer
	done   chan struct{}
	start  time.Time
}

// startCLI starts pgfence in the background; it is killed at cleanup if
// still running.
func startCLI(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := cliCommand(context.Background(), t, env, args...)
	p := &proc{t: t, cmd: cmd, lines: make(chan string, 100), stderr: &syncBuffer{}, done: make(chan struct{})}
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.start = time.Now()
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		_ = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

// line waits for the next stdout line.
func (p *proc) line() string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			<-p.done
			p.t.Fatalf("pgfence exited (%d) before printing a line; stderr:\n%s", p.cmd.ProcessState.ExitCode(), p.stderr)
		}
		return l
	case <-time.After(cliTimeout):
		p.t.Fatalf("no output within %s; stderr:\n%s", cliTimeout, p.stderr)
		return ""
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait() int {
	p.t.Helper()
	for range p.lines { // drain, so the reader can finish
	}
	select {
	case <-p.done:
	case <-time.After(cliTimeout):
		p.t.Fatalf("pgfence did not exit within %s; stderr:\n%s", cliTimeout, p.stderr)
	}
	p.t.Logf("background pgfence %v => %d; stderr:\n%s", p.cmd.Args[1:], p.cmd.ProcessState.ExitCode(), p.stderr)
	return p.cmd.ProcessState.ExitCode()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPasswordShown(t *testing.T) {
	const pw = "Q3XK7ZPA2MJW5RTE"
	u := "postgres://app:" + pw + "@127.0.0.1:5432/db?sslmode=disable"
	for _, c := range []struct {
		out  string
		args []string
		want bool
	}{
		{"connect " + pw + " failed", []string{"--database-url", u}, true},
		{"connect " + pw + " failed", []string{"DATABASE_URL=" + u}, true},
		{"connect xxxxx failed", []string{"--database-url", u}, false},
		{"connect %E1%9A%A0" + pw, []string{"postgres://app:%E1%9A%A0" + pw + "@h/db"}, true}, // as escaped
		{"connect \u16a0" + pw, []string{"postgres://app:%E1%9A%A0" + pw + "@h/db"}, true},    // decoded
		{"secret", []string{"postgres://app:secret@h/db"}, false},                             // too short to count
		{"connect " + pw, []string{"host=h password=" + pw}, false},                           // keyword/value: TestOutputHidesThePassword's
	} {
		if got := passwordShown(c.out, c.args); got != c.want {
			t.Errorf("passwordShown(%q, %q) = %v, want %v", c.out, c.args, got, c.want)
		}
	}
}
