package integration_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Worker processes are this test binary run again with
// -test.run=^TestHelperWorker$ and the environment variable workerEnv
// holding a JSON workerConfig. A worker reports to its parent with one JSON
// event per line on stdout and takes commands, one per line, on stdin. It
// ends when its stdin reaches end-of-file (the parent closes it), so that
// its own TestMain can check that it leaked no goroutine: a worker that
// exits non-zero fails the parent's test.

const workerEnv = "PGFENCE_IT_WORKER"

// workerConfig tells a worker what to do. Fields a role does not use are
// ignored.
type workerConfig struct {
	Role    string        // see workerRoles
	ID      string        // the worker's name, in events and rows
	URL     string        // database
	Name    string        // lease or lock name
	TTL     time.Duration // lease TTL
	Periods int           // "periods": how many periods to run
	Table   string        // protected table to write
	// Liveness interval and timeout of a "lock" worker's Locker (0 = default).
	LivenessInterval, LivenessTimeout time.Duration
}

// event is one line a worker writes to its parent.
type event struct {
	T      int64  `json:"t"`  // time.Now().UnixNano() in the worker
	Ev     string `json:"ev"` // what happened
	Worker string `json:"worker,omitempty"`
	Fence  int64  `json:"fence,omitempty"`
	Period int    `json:"period,omitempty"`
	PID    uint32 `json:"pid,omitempty"` // backend pid
	Result string `json:"result,omitempty"`
	Err    string `json:"err,omitempty"`
	// Op and the times below are a linearizability worker's record of one
	// operation (see linearizability_test.go).
	Op     *opRecord `json:"op,omitempty"`
	Detail string    `json:"detail,omitempty"`
}

// worker is the parent's handle on a worker process.
type worker struct {
	t      *testing.T
	id     string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	exited chan struct{} // closed when the process has exited and stdout is drained
	ended  chan struct{} // closed when the test ends: events are no longer read

	// Only the test's goroutine touches these.
	seen    []event // every event read so far, in order
	pending []event // read by await but not yet returned

	mu       sync.Mutex
	output   bytes.Buffer // stdout lines that are not events, and stderr
	waitErr  error
	signaled bool // the test killed it on purpose
}

// startWorker starts a worker process running cfg. The process is killed
// at the end of the test if it is still running.
func startWorker(t *testing.T, cfg workerConfig) *worker {
	t.Helper()
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.count=1", "-test.v=false", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), workerEnv+"="+string(js))
	setPdeathsig(cmd) // a worker never outlives a crashed parent
	w := &worker{t: t, id: cfg.ID, cmd: cmd, events: make(chan event, 4096),
		exited: make(chan struct{}), ended: make(chan struct{})}
	cmd.Stderr = &lockedWriter{w: &w.output, mu: &w.mu}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if w.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start worker %s: %v", cfg.ID, err)
	}
	go func() {
		defer close(w.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64*1024), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			var ev event
			if len(line) > 0 && line[0] == '{' && json.Unmarshal(line, &ev) == nil && ev.Ev != "" {
				select {
				case w.events <- ev:
				case <-w.ended: // nobody reads them any more: drain stdout so that the process can exit
				}
				continue
			}
			w.mu.Lock()
			w.output.Write(line)
			w.output.WriteByte('\n')
			w.mu.Unlock()
		}
		err := cmd.Wait()
		w.mu.Lock()
		w.waitErr = err
		w.mu.Unlock()
		close(w.events)
	}()
	t.Cleanup(func() {
		close(w.ended)
		_ = w.stdin.Close()
		select {
		case <-w.exited:
		case <-time.After(10 * time.Second):
			w.kill(syscall.SIGKILL)
			<-w.exited
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.waitErr != nil && !w.signaled {
			t.Errorf("worker %s exited: %v\n%s", w.id, w.waitErr, w.output.String())
		}
	})
	return w
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// next returns the worker's next event (one that await skipped first),
// failing the test if none comes within timeout or the worker exits. An
// "error" event fails the test.
func (w *worker) next(timeout time.Duration) event {
	w.t.Helper()
	if len(w.pending) > 0 {
		ev := w.pending[0]
		w.pending = w.pending[1:]
		return ev
	}
	return w.read(timeout)
}

// read returns the next event from the process.
func (w *worker) read(timeout time.Duration) event {
	w.t.Helper()
	select {
	case ev, ok := <-w.events:
		if !ok {
			w.t.Fatalf("worker %s exited before its next event: %v\n%s", w.id, w.exitErr(), w.log())
		}
		w.seen = append(w.seen, ev)
		if ev.Ev == "error" {
			w.t.Fatalf("worker %s failed: %s\n%s", w.id, ev.Err, w.log())
		}
		return ev
	case <-time.After(timeout):
		w.t.Fatalf("worker %s: no event within %v\n%s", w.id, timeout, w.dump())
		return event{}
	}
}

// await returns the first event of kind ev not yet returned, keeping the
// others it reads for later calls of next and await.
func (w *worker) await(ev string, timeout time.Duration) event {
	w.t.Helper()
	for i, e := range w.pending {
		if e.Ev == ev {
			w.pending = append(w.pending[:i:i], w.pending[i+1:]...)
			return e
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		e := w.read(time.Until(deadline))
		if e.Ev == ev {
			return e
		}
		w.pending = append(w.pending, e)
	}
}

// send writes one command line to the worker.
func (w *worker) send(cmd string) {
	w.t.Helper()
	if _, err := io.WriteString(w.stdin, cmd+"\n"); err != nil {
		w.t.Fatalf("send %q to worker %s: %v", cmd, w.id, err)
	}
}

// finish closes the worker's stdin and waits for it to exit; the cleanup
// registered by startWorker reports a non-zero exit. It returns the events
// the worker wrote after the last one read.
func (w *worker) finish(timeout time.Duration) []event {
	w.t.Helper()
	_ = w.stdin.Close()
	var rest []event
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-w.events:
			if !ok {
				<-w.exited
				return rest
			}
			if ev.Ev == "error" {
				w.t.Errorf("worker %s failed: %s", w.id, ev.Err)
			}
			w.seen = append(w.seen, ev)
			rest = append(rest, ev)
		case <-deadline:
			w.t.Fatalf("worker %s did not exit within %v\n%s", w.id, timeout, w.log())
		}
	}
}

// kill sends sig to the worker. SIGKILL marks the worker as killed on
// purpose, so that its exit status is not an error.
func (w *worker) kill(sig syscall.Signal) {
	w.t.Helper()
	if sig == syscall.SIGKILL {
		w.mu.Lock()
		w.signaled = true
		w.mu.Unlock()
	}
	if err := w.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		w.t.Fatalf("signal %v to worker %s: %v", sig, w.id, err)
	}
}

func (w *worker) exitErr() error {
	<-w.exited
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.waitErr
}

// dump makes a stuck worker print its goroutines (SIGQUIT) and returns
// its output, for the failure message.
func (w *worker) dump() string {
	w.mu.Lock()
	w.signaled = true
	w.mu.Unlock()
	_ = w.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-w.exited:
	case <-time.After(5 * time.Second):
	}
	return w.log()
}

func (w *worker) log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.TrimSpace(w.output.String())
}

// TestHelperWorker is not a test: it is the body of a worker process, run
// by startWorker. Run directly, it skips.
func TestHelperWorker(t *testing.T) {
	js := os.Getenv(workerEnv)
	if js == "" {
		t.Skip("helper process body: started by the other tests with " + workerEnv + " set")
	}
	var cfg workerConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		t.Fatalf("worker config: %v", err)
	}
	role, ok := workerRoles[cfg.Role]
	if !ok {
		t.Fatalf("unknown worker role %q", cfg.Role)
	}
	wk := &workerSide{cfg: cfg, cmds: make(chan string)}
	go wk.readCommands()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	err := role(ctx, wk)
	if err != nil {
		wk.emit(event{Ev: "error", Err: err.Error()})
	}
	// Wait for the parent to close stdin, so that the reader goroutine
	// ends before TestMain looks for leaks.
	for range wk.cmds {
	}
	if err != nil {
		t.Fatal(err)
	}
}

// workerSide is the worker's end of the conversation.
type workerSide struct {
	cfg  workerConfig
	cmds chan string // closed at end-of-file on stdin
	mu   sync.Mutex
}

func (wk *workerSide) readCommands() {
	defer close(wk.cmds)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		wk.cmds <- strings.TrimSpace(sc.Text())
	}
}

// emit writes ev to stdout, stamped with the time and the worker's id.
func (wk *workerSide) emit(ev event) {
	if ev.T == 0 {
		ev.T = time.Now().UnixNano()
	}
	ev.Worker = wk.cfg.ID
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	wk.mu.Lock()
	defer wk.mu.Unlock()
	fmt.Fprintf(os.Stdout, "%s\n", b)
}

// command waits for the next command; ok is false at end-of-file.
func (wk *workerSide) command(ctx context.Context) (string, bool) {
	select {
	case c, ok := <-wk.cmds:
		return c, ok
	case <-ctx.Done():
		return "", false
	}
}

// errKind classifies an error for events: "", "stale", "lost", "held",
// "locked", or "other".
func errKind(err error) string {
	switch {
	case err == nil:
		return "ok"
	case isStale(err):
		return "stale"
	case isLeaseLost(err):
		return "lost"
	case isHeld(err):
		return "held"
	case isLocked(err):
		return "locked"
	}
	return "other"
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
