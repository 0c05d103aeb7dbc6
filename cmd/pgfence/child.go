package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// forwardedSignals are passed on to the child's process group.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// child is a command run under a lease or lock.
//
// It runs in its own process group, so that the signals pgfence forwards,
// and the SIGTERM/SIGKILL it sends on loss, reach every process the command
// started (a shell pipeline, say), and so that a terminal's Ctrl-C reaches
// the command once, through pgfence, rather than twice. It is started with
// a parent-death signal (SIGKILL): if pgfence itself dies, nothing renews the
// lease, so the command must not run on.
type child struct {
	cmd    *exec.Cmd
	exited chan error // receives cmd.Wait's result once
}

// resolveCommand finds argv[0] before anything is acquired, so that a typo
// does not take a lease for nothing. Exit 127 when not found, 126 when not
// executable, as shells do.
func resolveCommand(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, nil
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return "", &exitError{code: exitNotFound, err: fmt.Errorf("command not found: %s", name)}
	}
	return "", &exitError{code: exitCannotExec, err: fmt.Errorf("cannot execute %s: %w", name, err)}
}

// startChild starts path with args and the extra environment variables.
//
// The start and the wait happen on one goroutine locked to its OS thread:
// Linux delivers the parent-death signal when the thread that forked the
// child exits, and the Go runtime may retire unlocked threads.
func startChild(path string, args, extraEnv []string, stdin io.Reader, stdout, stderr io.Writer) (*child, error) {
	cmd := exec.Command(path, args[1:]...)
	cmd.Args[0] = args[0]
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	c := &child{cmd: cmd, exited: make(chan error, 1)}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		c.exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return nil, &exitError{code: code, err: fmt.Errorf("start %s: %w", args[0], err)}
	}
	return c, nil
}

// signalGroup sends sig to the child's process group. A group that is
// already gone is not an error.
func (c *child) signalGroup(sig syscall.Signal) {
	_ = syscall.Kill(-c.cmd.Process.Pid, sig)
}

// exitCode turns cmd.Wait's result into the exit status pgfence passes on:
// the child's code, or 128+N when it died of signal N.
func exitCode(waitErr error, ps *os.ProcessState) int {
	if ps == nil {
		return exitFailure
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// supervise waits for the child to exit, forwarding signals from sigs to
// its process group. When lost closes (the lease or lock is gone), it
// reports why on stderr, sends SIGTERM to the group and SIGKILL grace later;
// once the child has exited after a loss, whatever is left of its group is
// killed too, since it runs without the lease. It returns the child's exit
// status and whether the loss happened.
func (c *child) supervise(sigs <-chan os.Signal, lost <-chan struct{}, what string, lossCause func() error, grace time.Duration, stderr io.Writer) (code int, wasLost bool) {
	var kill <-chan time.Time
	for {
		select {
		case err := <-c.exited:
			if wasLost {
				c.signalGroup(syscall.SIGKILL)
			}
			return exitCode(err, c.cmd.ProcessState), wasLost
		case s := <-sigs:
			if sig, ok := s.(syscall.Signal); ok {
				c.signalGroup(sig)
			}
		case <-lost:
			lost = nil // fires once
			wasLost = true
			fmt.Fprintf(stderr, "pgfence: %s lost (%v): sending SIGTERM to the command, SIGKILL in %s\n", what, lossCause(), grace)
			c.signalGroup(syscall.SIGTERM)
			t := time.NewTimer(grace)
			defer t.Stop()
			kill = t.C
		case <-kill:
			kill = nil
			fmt.Fprintf(stderr, "pgfence: the command outlived the %s grace period: sending SIGKILL\n", grace)
			c.signalGroup(syscall.SIGKILL)
		}
	}
}
