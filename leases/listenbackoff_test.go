package leases

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/slogtest"
)

// A listener that has listened for a while starts again from the
// shortest backoff when it fails, not from where earlier failures left
// it: six times in a row its connection's backend is terminated after it
// has listened for listenSteady (shortened to 300ms here), and each time
// it listens again within 3s. Before, the backoff only grew: 0.5s, 1s,
// 2s, 4s, 8s, each jittered to between half and all of it, so the fifth
// restart took at least 2s and the sixth at least 4s.
//
// Each failure's log record announces the wait before the next attempt:
// the listener listens again no sooner than that after the record's time.
// Before, it logged the backoff, not the jittered wait it slept.
func TestListenerBackoffResetsAfterListening(t *testing.T) {
	t.Parallel()
	var logs slogtest.Buffer
	c, pool := setup(t, WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
	c.hooks.listenSteady = 300 * time.Millisecond
	ctx := testContext(t)
	waitListening(t, c)
	listening := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.listenOK
	}
	for i := range 6 {
		var pid int32
		pgtest.WaitFor(t, testTimeout, "the listener's backend", func() bool {
			err := pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
				WHERE datname = current_database() AND query = $1 AND state = 'idle'`, sqlListen).Scan(&pid)
			if err != nil {
				t.Fatal(err)
			}
			return pid != 0 && listening()
		})
		// The premise: it has listened for longer than listenSteady.
		time.Sleep(400 * time.Millisecond)
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
			t.Fatal(err)
		}
		pgtest.WaitFor(t, testTimeout, "the listener to notice", func() bool { return !listening() })
		start := time.Now()
		pgtest.WaitFor(t, testTimeout, "the listener to listen again", listening)
		took := time.Since(start)
		failures := retryRecords(t, logs.String(), "leases: listener failed")
		if len(failures) < i+1 {
			t.Fatalf("%d failures logged after restart %d, want %d:\n%s", len(failures), i+1, i+1, logs.String())
		}
		f := failures[len(failures)-1] // the attempt that listened came after it
		t.Logf("restart %d: listening again after %s (logged retry %s)", i+1, took.Round(time.Millisecond), f.Retry.Round(time.Millisecond))
		if took > 3*time.Second {
			t.Errorf("restart %d took %s, want within 3s (the shortest backoff, 0.5s, and a reconnect)", i+1, took)
		}
		if since := time.Since(f.Time); since < f.Retry {
			t.Errorf("restart %d: listening again %s after the failure's log record, which said retry after %s", i+1, since, f.Retry)
		}
	}
}

type retryRecord struct {
	Msg   string
	Time  time.Time
	Retry time.Duration
}

// retryRecords returns the JSON log records whose message starts with msg,
// in order, failing t if one has no retry.
func retryRecords(t *testing.T, logs, msg string) []retryRecord {
	t.Helper()
	var out []retryRecord
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var rec retryRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if !strings.HasPrefix(rec.Msg, msg) {
			continue
		}
		if rec.Retry <= 0 || rec.Time.IsZero() {
			t.Fatalf("log record %q has no time or retry", sc.Text())
		}
		out = append(out, rec)
	}
	return out
}
