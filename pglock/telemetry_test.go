package pglock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/metrictest"
	"github.com/pgfence/pgfence/internal/slogtest"
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

// TestLargeSetIsLoggedByItsFirstNames: a set of 100 names is logged, and
// measured with WithNameAttribute, by its first five names and how many
// more, with the first five keys; Name still joins them all. A set of
// thousands would otherwise make every record as long as the set.
func TestLargeSetIsLoggedByItsFirstNames(t *testing.T) {
	t.Parallel()
	var buf slogtest.Buffer
	mr := metrictest.New(t)
	pool, l := setup(t, WithMeterProvider(mr.MP), WithNameAttribute(true),
		WithLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := testContext(t)
	names := make([]string, 100)
	for i := range names {
		names[i] = fmt.Sprintf("big-set/%03d", i)
	}
	lk, err := l.LockAll(ctx, names...)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(lk.Name(), ", ") + 1; got != len(names) {
		t.Errorf("Name() joins %d names, want %d", got, len(names))
	}
	first := lk.Names()[:5]
	want := strings.Join(first, ", ") + ", and 95 more"
	// Refused while held: the failed wait is measured under the same name.
	other := newLocker(t, pool, WithMeterProvider(mr.MP), WithNameAttribute(true),
		WithLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	if _, err := other.TryLockAll(ctx, names...); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLockAll of a held set = %v, want ErrLocked", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	var records int
	for line := range strings.Lines(buf.String()) {
		var rec struct {
			Msg  string
			Name string
			Keys []int64
		}
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec.Msg != "pglock: lock acquired" && rec.Msg != "pglock: lock released" {
			continue
		}
		records++
		if rec.Name != want {
			t.Errorf("%s: name = %.200q, want %q", rec.Msg, rec.Name, want)
		}
		if len(rec.Keys) != 5 || rec.Keys[0] != Key(first[0]) {
			t.Errorf("%s: keys = %v, want the first five, from %d", rec.Msg, rec.Keys, Key(first[0]))
		}
	}
	if records != 2 {
		t.Errorf("%d acquired and released records, want 2:\n%s", records, buf.String())
	}
	got := mr.Collect(t)
	for _, m := range []struct{ metric, attrs string }{
		{metricWait, "mode=exclusive,name=" + want + ",outcome=acquired,try=false"},
		{metricWait, "mode=exclusive,name=" + want + ",outcome=locked,try=true"},
		{metricHold, "mode=exclusive,name=" + want + ",outcome=unlocked"},
	} {
		if p := metrictest.Find(t, got, m.metric, m.attrs); p.Count != 1 {
			t.Errorf("%s{%s}: %d measurements, want 1", m.metric, m.attrs, p.Count)
		}
	}
}
