package pglock

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestDestroyedLogOmitsUnknownPID: a connection destroyed before its
// backend was known (a failed statement over database/sql) is logged
// without a pid, never with a made-up pid 0; a known one keeps it.
func TestDestroyedLogOmitsUnknownPID(t *testing.T) {
	var buf bytes.Buffer
	tel := &telemetry{log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	tel.destroyed("job", 0, "acquire failed")
	tel.destroyed("job", 4242, "lock lost")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("logged %d lines, want 2:\n%s", len(lines), buf.String())
	}
	if strings.Contains(lines[0], "pid=") || !strings.Contains(lines[0], "why=\"acquire failed\"") {
		t.Errorf("unknown backend logged as %q, want no pid and the reason", lines[0])
	}
	if !strings.Contains(lines[1], "pid=4242") {
		t.Errorf("known backend logged as %q, want pid=4242", lines[1])
	}
}
