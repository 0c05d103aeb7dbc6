// Package gocmd serves tests that run the go command: the child builds as
// the test binary was built.
package gocmd

import (
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
