package pgfencetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// PauseProcess freezes p with SIGSTOP, as a long GC pause, a swapped-out VM
// or a debugger would: it keeps its connections and its lease, but runs no
// code, so its lease expires under it. The returned function resumes it
// with SIGCONT; it is safe to call more than once, and runs when t ends if
// the test has not called it. PauseProcess fails t if the signal cannot be
// sent, or at once if p is nil. p is usually a child the test started
// (exec.Cmd.Process, which is nil until Start succeeds).
func PauseProcess(t testing.TB, p *os.Process) (resume func()) {
	t.Helper()
	if p == nil {
		t.Fatalf("pgfencetest: PauseProcess: the process is nil (start the command first)")
	}
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("pgfencetest: SIGSTOP process %d: %v", p.Pid, err)
	}
	return once(t, func() error {
		if err := p.Signal(syscall.SIGCONT); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("SIGCONT process %d: %w", p.Pid, err)
		}
		return nil
	})
}

// PauseContainer freezes the container id (name or ID) with the Docker
// engine's pause (the cgroup freezer): every process in it stops at once,
// connections stay open. The returned function unpauses it; it is safe to
// call more than once, and runs when t ends if the test has not called it.
// PauseContainer fails t if id is empty, no Docker engine answers or the
// pause fails.
func PauseContainer(t testing.TB, id string) (resume func()) {
	t.Helper()
	if id == "" {
		t.Fatalf("pgfencetest: PauseContainer: the container ID is empty")
	}
	err := withDocker(func(ctx context.Context, cli *testcontainers.DockerClient) error {
		_, err := cli.ContainerPause(ctx, id, client.ContainerPauseOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("pgfencetest: pause container %s: %v", id, err)
	}
	return once(t, func() error {
		return withDocker(func(ctx context.Context, cli *testcontainers.DockerClient) error {
			_, err := cli.ContainerUnpause(ctx, id, client.ContainerUnpauseOptions{})
			if err != nil {
				return fmt.Errorf("unpause container %s: %w", id, err)
			}
			return nil
		})
	})
}

// once returns a function that runs undo the first time it is called, and
// registers it to run when t ends. An error fails t.
func once(t testing.TB, undo func() error) func() {
	var o sync.Once
	f := func() {
		o.Do(func() {
			if err := undo(); err != nil {
				t.Errorf("pgfencetest: %v", err)
			}
		})
	}
	t.Cleanup(f)
	return f
}

// withDocker calls f with a Docker client, closed afterwards, and a minute
// to do its work.
func withDocker(f func(context.Context, *testcontainers.DockerClient) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	return f(ctx, cli)
}
