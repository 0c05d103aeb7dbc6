package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
)

// forwardedSignals are passed on to the child's process group.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// child is a command run under a lease or lock, through the reaper
// (reaper.go): pgfence starts the reaper, the reaper starts the command in
// a process group of its own, so that the signals pgfence forwards, and the
// SIGTERM/SIGKILL on loss, reach every process the command started (a
// shell pipeline, say), and so that a terminal's Ctrl-C reaches the command
// once, through pgfence, rather than twice.
type child struct {
	reaper *exec.Cmd
	ctl    *os.File   // the write end of the reaper's control pipe
	exited chan error // receives the reaper's Wait result once
}

// resolveCommand finds argv[0] before anything is acquired, so that a typo
// does not take a lease for nothing. Exit 127 when not found, 126 when not
// executable, as shells do.
func resolveCommand(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	shown := display(name) // quoted if it has a character that does not print
	if name == "" {
		shown = `""`
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return "", &exitError{code: exitNotFound, err: fmt.Errorf("command not found: %s", shown)}
	}
	return "", &exitError{code: exitCannotExec, err: fmt.Errorf("cannot execute %s: %w", shown, err)}
}

// startReaper starts the reaper, which waits for start to tell it what to
// run. It is started before the lease's first deadline is taken, so that
// the time it takes to start up does not count against the deadline.
func startReaper(stdin io.Reader, stdout, stderr io.Writer) (*child, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("reaper control pipe: %w", err)
	}
	// /proc/self/exe rather than os.Executable: the very binary running,
	// even if the file has been replaced since (an upgrade mid-run).
	// The descriptors pgfence inherited keep their numbers, for the
	// command (a script's 3>log, a lock file's descriptor); the control
	// pipe goes above them.
	passed := inheritedFiles()
	cmd := exec.Command("/proc/self/exe", reaperName, strconv.Itoa(3+len(passed)))
	cmd.Args[0] = os.Args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.ExtraFiles = append(passed, r)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	_ = r.Close() // the reaper has its own copy, if it started
	for _, f := range passed {
		if f != nil {
			_ = f.Close() // the reaper has them; pgfence has no use for them
		}
	}
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("start the reaper (%s %s): %w", cmd.Path, reaperName, err)
	}
	c := &child{reaper: cmd, ctl: w, exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	return c, nil
}

// start has the reaper start the command cfg describes. The exit status
// supervise returns is then the command's; 126/127 when it cannot be
// started.
func (c *child) start(cfg reaperConfig) error {
	conf, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("reaper configuration: %w", err)
	}
	c.send(string(conf))
	return nil
}

// abandon ends a reaper that was given no command, and waits for it.
func (c *child) abandon() {
	_ = c.ctl.Close()
	<-c.exited
}

// send writes one control message. A reaper that has exited cannot read
// it, and needs it no more: errors are ignored.
func (c *child) send(line string) {
	_, _ = io.WriteString(c.ctl, line+"\n")
}

// exitCode turns cmd.Wait's result into the exit status pgfence passes on:
// the process's code, or 128+N when it died of signal N.
func exitCode(_ error, ps *os.ProcessState) int {
	if ps == nil {
		return exitFailure
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok {
		return exitStatus(ws)
	}
	return ps.ExitCode()
}

// supervise waits for the reaper to exit, passing it signals from sigs,
// the new local deadlines from deadlines, and the loss when lost closes (the
// lease or lock is gone: reported on stderr with lossCause). It returns the
// command's exit status — but 1 for a command that exited 0 after the loss,
// whose work was cut short or overlapped another holder's — and closes the
// control pipe.
func (c *child) supervise(sigs <-chan os.Signal, deadlines <-chan int64, lost <-chan struct{}, what string, lossCause func() error, stderr io.Writer) int {
	defer c.ctl.Close()
	wasLost := false
	for {
		select {
		case err := <-c.exited:
			code := exitCode(err, c.reaper.ProcessState)
			if wasLost && code == exitOK {
				fmt.Fprintf(stderr, "pgfence: the command exited 0 after the %s was lost: exit 1, its work may be unfinished\n", what)
				return exitFailure
			}
			return code
		case s := <-sigs:
			if sig, ok := s.(syscall.Signal); ok {
				c.send(fmt.Sprintf("%s %d", msgSignal, sig))
			}
		case d := <-deadlines:
			c.send(fmt.Sprintf("%s %d", msgDeadline, d))
		case <-lost:
			lost = nil // fires once
			wasLost = true
			fmt.Fprintf(stderr, "pgfence: %s lost: %v\n", what, lossCause())
			c.send(msgStop)
		}
	}
}

// inheritedFiles returns the descriptors above stderr that pgfence was
// started with and that stay open across exec (no FD_CLOEXEC: Go opens
// its own with it), as ExtraFiles: entry i is descriptor 3+i, nil where
// none was inherited (the reaper then has that number closed).
func inheritedFiles() []*os.File {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	var fds []int
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		if errno == 0 && flags&syscall.FD_CLOEXEC == 0 {
			fds = append(fds, fd)
		}
	}
	if len(fds) == 0 {
		return nil
	}
	files := make([]*os.File, slices.Max(fds)-2)
	for _, fd := range fds {
		files[fd-3] = os.NewFile(uintptr(fd), "inherited")
	}
	return files
}
