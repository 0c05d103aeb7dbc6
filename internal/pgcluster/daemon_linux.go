package pgcluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// daemon is a long-running helper process (etcd, HAProxy, Patroni) owned by
// this process: its output goes to a log file, it gets a signal if this
// process dies, and stop ends it and waits for it.
type daemon struct {
	name string
	log  string
	cmd  *exec.Cmd
	exit <-chan struct{} // closed once it has exited
}

// startDaemon starts argv with output to logPath, in host's network
// namespace (nil: this process's), as cred (nil: this process's user).
// deathSig is sent to it if this process dies first.
func startDaemon(name, logPath string, host *nsHost, cred *syscall.Credential, deathSig syscall.Signal, argv ...string) (*daemon, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %s log: %w", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = filepath.Dir(logPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true, Pdeathsig: deathSig}
	d := &daemon{name: name, log: logPath, cmd: cmd}
	if host != nil {
		d.exit, err = host.start(cmd)
	} else if err = cmd.Start(); err == nil {
		exit := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exit) }()
		d.exit = exit
	}
	_ = logf.Close() // the child has its own copy
	if err != nil {
		return nil, fmt.Errorf("pgcluster: start %s: %w", name, err)
	}
	return d, nil
}

// running reports whether the process has not exited yet.
func (d *daemon) running() bool {
	select {
	case <-d.exit:
		return false
	default:
		return true
	}
}

// stop sends sig, waits up to grace for the exit, then SIGKILLs it and
// waits. Safe to call on an exited daemon.
func (d *daemon) stop(sig syscall.Signal, grace time.Duration) {
	if !d.running() {
		return
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.exit:
	case <-time.After(grace):
		_ = d.cmd.Process.Signal(syscall.SIGKILL)
		<-d.exit
	}
}

// logTail is the last n bytes of the daemon's log.
func (d *daemon) logTail(n int) string {
	b, _ := os.ReadFile(d.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// waitUntil polls ready every 50ms until it returns nil, the daemon exits,
// or timeout passes.
func (d *daemon) waitUntil(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		if !d.running() {
			return fmt.Errorf("pgcluster: %s exited during start-up:\n%s", d.name, d.logTail(3000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: %s not ready within %v: %w\n%s", d.name, timeout, err, d.logTail(3000))
		}
		time.Sleep(50 * time.Millisecond) // poll: nothing announces readiness
	}
}
