package integration_test

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the worker if the test process dies.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
