// Package gocmd serves tests that run the go command: the child builds as
// the test binary was built.
package gocmd

import (
	"os"
	"runtime/debug"
	"strings"
)

// GOFLAGS returns base, a GOFLAGS value, with -race added when the running
// binary was built with the race detector. A test that runs go build, go
// list -export or the like sets it as the child's GOFLAGS, so that the
// child compiles dependencies as the test binary's own build did and finds
// them in the build cache: CI builds everything with -race, and a child
// without it compiled every dependency a second time.
func GOFLAGS(base string) string {
	if !race() {
		return base
	}
	return strings.TrimSpace(base + " -race")
}

// QuickExit is the GORACE entry (name=value) for the environment of a
// child built with the race detector, such as the test binary run again as
// a command: without it the child sleeps a second at exit, waiting for
// reports from goroutines still running, and a test that runs it hundreds
// of times waits minutes. It keeps the options of the running GORACE.
func QuickExit() string {
	return "GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

// race reports whether the running binary was built with -race.
func race() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
