// Package leangraph holds one test: a program that imports pgfence's
// library packages carries nothing heavy in its module graph.
package leangraph

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/gocmd"
)

// forbidden are module paths (prefixes) that must not reach a consumer's
// module graph: the test and CLI tooling lives in modules of its own.
var forbidden = []string{
	"github.com/testcontainers/",
	"github.com/docker/",
	"github.com/moby/",
	"github.com/spf13/cobra",
	"github.com/compose-spec/",
	"github.com/anishathalye/porcupine",
	"github.com/golang-migrate/",
}

// TestConsumerModuleGraph builds a throwaway consumer module that imports
// pglock, leases, fencing and migrations (with a replace to this checkout,
// outside any workspace), tidies it, and checks `go mod graph` and the
// consumer's go directive: Go 1.25 must do.
func TestConsumerModuleGraph(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	root, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/consumer\n\ngo 1.25.0\n\nrequire github.com/pgfence/pgfence v0.0.0-00010101000000-000000000000\n\nreplace github.com/pgfence/pgfence => "+root+"\n")
	write("main.go", `package main

import (
	_ "github.com/pgfence/pgfence/fencing"
	_ "github.com/pgfence/pgfence/leases"
	_ "github.com/pgfence/pgfence/migrations"
	_ "github.com/pgfence/pgfence/pglock"
)

func main() {}
`)
	gocmd := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		// GOFLAGS as this test binary was built (-race under CI), so that
		// the build finds the dependencies in the build cache.
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS="+gocmd.GOFLAGS("-mod=mod"), "GOTOOLCHAIN=local")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	gocmd("mod", "tidy")
	graph := gocmd("mod", "graph")
	for _, line := range strings.Split(graph, "\n") {
		for _, f := range forbidden {
			if strings.Contains(line, " "+f) || strings.HasPrefix(line, f) {
				t.Errorf("the consumer's module graph holds %s: %q", f, line)
			}
		}
	}
	mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "\ngo 1.25") {
		t.Errorf("tidy raised the consumer's go directive above 1.25:\n%s", mod)
	}
	gocmd("build", "./...")
	t.Logf("consumer module graph: %d edges", strings.Count(graph, "\n"))
}
