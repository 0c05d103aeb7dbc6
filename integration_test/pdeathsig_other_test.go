//go:build !linux

package integration_test

import "os/exec"

// setPdeathsig has no portable equivalent outside Linux; the cleanup that
// startWorker registers kills workers of a test that ends normally.
func setPdeathsig(cmd *exec.Cmd) {}
