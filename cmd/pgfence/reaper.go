package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// The reaper is what enforces the timing rule (deadline.go) whatever
// happens to pgfence. run starts it by re-executing its own binary
// (/proc/self/exe __reaper) in a process group of its own; the reaper
// becomes a child subreaper and starts the command in a further process
// group. pgfence drives it over a pipe (the descriptor after those the
// command inherits, see startReaper): new deadlines after each
// renewal, "stop" when the lease or lock is lost, signals to forward.
//
// Why a separate process and not the alternatives:
//   - PR_SET_PDEATHSIG on the command alone kills only the direct child
//     when pgfence dies; its children run on (sh -c 'sleep 301 | cat').
//   - pgfence as a subreaper collects orphans only while it lives.
//   - A cgroup would hold the whole tree, but needs a delegated cgroup v2
//     subtree, which a cron job or container often does not have.
//   - A frozen pgfence (SIGSTOP, a debugger, a stopped VM thread) enforces
//     nothing: some process that is not frozen with it must own a timer
//     to the local deadline. Only a second process can.
//
// The reaper sees pgfence die as end of file on the pipe: that needs no
// signal and works whichever of pgfence's threads dies. As a subreaper it
// inherits every orphan of the command's tree, also processes that moved to
// another process group or session, so it can find them all in /proc and
// kill them. It leaves SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 sent
// to it on to the command's group, and exits with the command's status
// once no process of the tree is left (1 for a 0 when it stopped the
// command at the local deadline: pgfence may not know yet that the lease
// is lost). The command gets PR_SET_PDEATHSIG
// against the reaper, in case the reaper itself is killed.
//
// What the reaper does not survive: SIGKILL of the reaper itself (the
// command dies, its descendants may not) and a SIGSTOP of the reaper.

const reaperName = "__reaper"

// reaperConfig is the first line pgfence writes to the reaper (JSON).
type reaperConfig struct {
	Path     string        `json:"path"` // resolved argv[0]
	Args     []string      `json:"args"`
	Env      []string      `json:"env"`
	What     string        `json:"what"`     // `lease "x" (fence 7)`, for messages
	Grace    time.Duration `json:"grace"`    // SIGTERM to SIGKILL
	Deadline int64         `json:"deadline"` // CLOCK_MONOTONIC ns; 0: none (a lock)
	// OrphanGrace replaces Grace when pgfence dies: a lease stays valid
	// until its deadline, a lock ends with pgfence's session.
	OrphanGrace time.Duration `json:"orphan_grace"`
}

// Control messages, one a line, after the config.
const (
	msgDeadline = "deadline" // deadline N: the local deadline is now N
	msgStop     = "stop"     // the lease or lock is lost
	msgSignal   = "signal"   // signal N: forward signal N to the command
)

func newReaperCmd() *cobra.Command {
	return &cobra.Command{
		Use:                reaperName,
		Hidden:             true,
		DisableFlagParsing: true,
		Args:               argsUsage(cobra.ExactArgs(1)), // the control pipe's descriptor
		RunE: action(func(cmd *cobra.Command, args []string) error {
			fd, err := strconv.Atoi(args[0])
			if err != nil || fd < 3 {
				return fmt.Errorf("reaper: control descriptor %q", args[0])
			}
			return reap(os.NewFile(uintptr(fd), "pgfence control"), cmd.ErrOrStderr())
		}),
	}
}

// reaper is the state of the reaper process's main loop.
type reaper struct {
	cfg      reaperConfig
	stderr   io.Writer
	pgid     int   // the command's process group (and pid)
	status   int   // the command's exit status once reaped; -1 before
	deadline int64 // the local deadline (CLOCK_MONOTONIC ns); 0: none
	termAt   int64 // CLOCK_MONOTONIC ns when SIGTERM went out; 0 before
	killAt   int64 // when SIGKILL is due once terminating
	killed   bool  // SIGKILL sent: keep killing until the tree is gone
	// cutShort: the command was stopped at the local deadline while it
	// ran. pgfence may not know (the lease is still held by its own count
	// until the deadline), so the reaper turns the command's 0 into 1.
	cutShort bool
}

// waitEvent is a process the reaper reaped; pid 0 means none is left.
type waitEvent struct {
	pid int
	ws  syscall.WaitStatus
}

func reap(ctl *os.File, stderr io.Writer) error {
	syscall.CloseOnExec(int(ctl.Fd())) // not for the command
	in := bufio.NewReader(ctl)
	line, err := in.ReadString('\n')
	if errors.Is(err, io.EOF) {
		return &exitError{code: exitFailure} // pgfence gave up before the command started, and says why
	}
	r := &reaper{stderr: stderr, status: -1}
	if err == nil {
		err = json.Unmarshal([]byte(line), &r.cfg)
	}
	if err != nil {
		return fmt.Errorf("reaper: read the configuration from pgfence: %w", err)
	}
	if err := becomeSubreaper(); err != nil {
		return fmt.Errorf("reaper: PR_SET_CHILD_SUBREAPER: %w", err)
	}
	msgs := make(chan string, 8)
	go readControl(in, msgs) // ends with the process: blocked reading pgfence's pipe
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	started := make(chan error, 1)
	reaped := make(chan waitEvent, 8)
	go r.startAndReap(started, reaped)
	if err := <-started; err != nil {
		return err
	}
	r.deadline = r.cfg.Deadline
	return r.loop(msgs, sigs, reaped)
}

// startAndReap starts the command and then reaps every child the reaper
// gets, until none is left. It runs on one locked OS thread for the whole
// life of the command: the kernel sends the parent-death signal when the
// thread that forked exits.
func (r *reaper) startAndReap(started chan<- error, reaped chan<- waitEvent) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	pid, err := syscall.ForkExec(r.cfg.Path, r.cfg.Args, &syscall.ProcAttr{
		Env:   r.cfg.Env,
		Files: []uintptr{0, 1, 2},
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		code := exitCannotExec
		if errors.Is(err, syscall.ENOENT) {
			code = exitNotFound
		}
		started <- &exitError{code: code, err: fmt.Errorf("start %s: %w", r.cfg.Args[0], err)}
		return
	}
	r.pgid = pid
	started <- nil
	for {
		var ws syscall.WaitStatus
		wpid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil { // ECHILD: the whole tree is gone
			reaped <- waitEvent{}
			return
		}
		reaped <- waitEvent{pid: wpid, ws: ws}
	}
}

// readControl passes pgfence's messages on; it closes msgs at end of file,
// that is when pgfence has exited.
func readControl(in *bufio.Reader, msgs chan<- string) {
	defer close(msgs)
	for {
		line, err := in.ReadString('\n')
		if err != nil {
			return
		}
		msgs <- strings.TrimSuffix(line, "\n")
	}
}

// killPoll is how often the reaper kills again after SIGKILL: a process
// forked just before may have escaped the previous round. There is no
// event for it.
const killPoll = 20 * time.Millisecond

func (r *reaper) loop(msgs <-chan string, sigs <-chan os.Signal, reaped <-chan waitEvent) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if d, ok := r.nextTimer(); ok {
			timer.Reset(d)
		} else {
			timer.Stop()
		}
		select {
		case m, ok := <-msgs:
			if !r.receive(m, ok) {
				msgs = nil
			}
		case s := <-sigs:
			r.signalGroup(s.(syscall.Signal))
		case ev := <-reaped:
			if ev.pid == 0 {
				if r.status < 0 {
					return &exitError{code: exitFailure, err: errors.New("reaper: the command's status was lost")}
				}
				if r.cutShort && r.status == exitOK {
					fmt.Fprintf(r.stderr, "pgfence: the command exited 0 after %s was not renewed in time: exit 1, its work may be unfinished\n", r.cfg.What)
					return &exitError{code: exitFailure}
				}
				return &exitError{code: r.status}
			}
			if ev.pid != r.pgid {
				continue // an orphan of the tree
			}
			r.status = exitStatus(ev.ws)
			if n := len(descendants(os.Getpid())); n > 0 && r.termAt == 0 {
				r.terminate(r.cfg.Grace, fmt.Sprintf("the command exited and left %d processes running", n))
			}
		case <-timer.C:
			// A newer deadline may be waiting (the reaper was slow to
			// run): read what pgfence has sent before acting.
			msgs = r.drain(msgs)
			if d, ok := r.nextTimer(); r.killed || ok && d <= 0 {
				r.due()
			}
		}
	}
}

// drain handles the control messages already received, and returns msgs,
// or nil once pgfence has exited.
func (r *reaper) drain(msgs <-chan string) <-chan string {
	for {
		select {
		case m, ok := <-msgs:
			if !r.receive(m, ok) {
				return nil
			}
		default:
			return msgs
		}
	}
}

// receive handles what a receive from msgs gave; false means that pgfence
// has exited (msgs is closed).
func (r *reaper) receive(m string, ok bool) bool {
	if !ok {
		r.terminate(r.cfg.OrphanGrace, "pgfence exited while the command ran")
		return false
	}
	r.handle(m)
	return true
}

// handle acts on one control message from pgfence.
func (r *reaper) handle(m string) {
	verb, arg, _ := strings.Cut(m, " ")
	n, _ := strconv.ParseInt(arg, 10, 64)
	switch verb {
	case msgDeadline:
		r.deadline = max(r.deadline, n)
	case msgStop:
		r.terminate(r.cfg.Grace, r.cfg.What+" lost")
	case msgSignal:
		r.signalGroup(syscall.Signal(n))
	}
}

// signalGroup sends sig to the command's process group while the command
// has not been reaped: after that the group's id may be reused.
func (r *reaper) signalGroup(sig syscall.Signal) {
	if r.status < 0 {
		_ = syscall.Kill(-r.pgid, sig)
	}
}

// signalTree sends sig to the command's process group (while that is
// safe) and to every descendant of the reaper.
func (r *reaper) signalTree(sig syscall.Signal) {
	r.signalGroup(sig)
	for _, p := range descendants(os.Getpid()) {
		_ = syscall.Kill(p, sig)
	}
}

// nextTimer is how long until the next SIGTERM or SIGKILL is due, if one
// is.
func (r *reaper) nextTimer() (time.Duration, bool) {
	switch {
	case r.killed:
		return killPoll, true
	case r.termAt != 0:
		return untilMono(r.killAt), true
	case r.deadline != 0:
		return untilMono(r.deadline - int64(r.cfg.Grace)), true
	}
	return 0, false
}

// due runs when the timer fires.
func (r *reaper) due() {
	switch {
	case r.killed:
		r.signalTree(syscall.SIGKILL)
	case r.termAt != 0 && r.killAt == r.deadline:
		r.kill("the lease's local deadline has come")
	case r.termAt != 0:
		r.kill("the command outlived its grace period")
	default:
		r.cutShort = r.status < 0
		left := untilMono(r.deadline).Round(time.Millisecond)
		r.terminate(r.cfg.Grace, fmt.Sprintf("%s: not renewed in time, its local deadline is in %s", r.cfg.What, left))
	}
}

// terminate sends SIGTERM to the tree, if it has not had it, and makes
// SIGKILL due grace later, at the local deadline at the latest; with no
// time left, it sends SIGKILL at once. why is said on stderr.
func (r *reaper) terminate(grace time.Duration, why string) {
	if r.killed {
		return
	}
	now := monoNow()
	killAt := now + int64(grace)
	if r.deadline != 0 {
		killAt = min(killAt, r.deadline)
	}
	switch {
	case r.termAt != 0:
		r.killAt = min(r.killAt, killAt)
	case killAt <= now:
		r.kill(why)
	default:
		r.termAt, r.killAt = now, killAt
		fmt.Fprintf(r.stderr, "pgfence: %s: sending SIGTERM to the command, SIGKILL in %s\n", why, untilMono(killAt).Round(time.Millisecond))
		r.signalTree(syscall.SIGTERM)
	}
}

// kill sends SIGKILL to the tree, and keeps doing so until it is gone.
// why is said on stderr.
func (r *reaper) kill(why string) {
	fmt.Fprintf(r.stderr, "pgfence: %s: sending SIGKILL to the command\n", why)
	r.killed = true
	r.signalTree(syscall.SIGKILL)
}

// exitStatus is the status pgfence passes on: the exit code, or 128+N
// after death by signal N.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}
