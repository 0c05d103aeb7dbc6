package gocmd

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestGOFLAGSFollowsTheBuild compares GOFLAGS with what go version -m reads
// from this test binary: -race is added exactly when the binary has it (CI
// runs it with -race; a plain go test without).
func TestGOFLAGSFollowsTheBuild(t *testing.T) {
	out, err := exec.Command("go", "version", "-m", os.Args[0]).CombinedOutput()
	if err != nil {
		t.Fatalf("go version -m: %v\n%s", err, out)
	}
	built := strings.Contains(string(out), "\tbuild\t-race=true\n")
	want := "-mod=mod"
	if built {
		want = "-mod=mod -race"
	}
	if got := GOFLAGS("-mod=mod"); got != want {
		t.Errorf("GOFLAGS(%q) = %q, want %q (go version -m:\n%s)", "-mod=mod", got, want, out)
	}
	want = strings.TrimSpace(strings.TrimPrefix(want, "-mod=mod"))
	if got := GOFLAGS(""); got != want {
		t.Errorf("GOFLAGS(\"\") = %q, want %q", got, want)
	}
}

// TestQuickExitKeepsTheOptions: the child exits at once and keeps the
// race detector's other options from the test's own GORACE.
func TestQuickExitKeepsTheOptions(t *testing.T) {
	for gorace, want := range map[string]string{
		"":                "GORACE=atexit_sleep_ms=0",
		"halt_on_error=1": "GORACE=halt_on_error=1 atexit_sleep_ms=0",
	} {
		t.Setenv("GORACE", gorace)
		if got := QuickExit(); got != want {
			t.Errorf("QuickExit() with GORACE=%q = %q, want %q", gorace, got, want)
		}
	}
}
