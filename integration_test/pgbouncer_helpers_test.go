package integration_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// bouncer starts a PgBouncer in mode in front of the server of u (a test
// database from setup) and returns the URL of that database through it.
// The URL selects pgx's exec query mode: PgBouncer 1.18 cannot pool the
// named prepared statements of pgx's default mode in transaction mode.
func bouncer(t *testing.T, u string, mode pgtest.PoolMode, opts ...pgtest.BouncerOption) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatalf("parse %s: %v", u, err)
	}
	b := pgtest.StartPgBouncer(t, u, mode, opts...)
	return b.URL(cfg.Database) + "&default_query_exec_mode=exec"
}

// logRecorder is a slog.Handler that keeps every record (all levels), so
// that a test can await what a client logs.
type logRecorder struct {
	mu      sync.Mutex
	records []slog.Record
	changed chan struct{} // buffered 1: a record was added
}

func newLogRecorder() *logRecorder { return &logRecorder{changed: make(chan struct{}, 1)} }

func (r *logRecorder) logger() *slog.Logger { return slog.New(r) }

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.records = append(r.records, rec.Clone())
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

// count returns how many records matched.
func (r *logRecorder) count(match func(slog.Record) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.records {
		if match(rec) {
			n++
		}
	}
	return n
}

// await waits until a record matches, failing t after timeout.
func (r *logRecorder) await(t *testing.T, timeout time.Duration, what string, match func(slog.Record) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for r.count(match) == 0 {
		select {
		case <-r.changed:
		case <-deadline.C:
			t.Fatalf("no log record %s within %v", what, timeout)
		}
	}
}

// fallbackLogged matches the leases listener's Info record saying that
// notifications do not reach the client and waiters poll.
func fallbackLogged(rec slog.Record) bool {
	return rec.Level == slog.LevelInfo && strings.Contains(rec.Message, "notifications do not reach")
}

// waitingAtLeast matches a waiting acquirer's Debug record ("leases:
// waiting") whose next poll is at least d away. Tests using it wait for one
// lease only.
func waitingAtLeast(d time.Duration) func(slog.Record) bool {
	return func(rec slog.Record) bool {
		if !strings.Contains(rec.Message, "waiting") {
			return false
		}
		long := false
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "poll" && a.Value.Kind() == slog.KindDuration && a.Value.Duration() >= d {
				long = true
			}
			return true
		})
		return long
	}
}

// advisoryLockTracer calls onLocked after every statement that takes a
// session advisory lock (pg_advisory_lock, pg_try_advisory_lock and their
// _shared forms) has returned on a pool's connection, before pglock runs
// its next statement.
type advisoryLockTracer struct {
	onLocked func()
}

type lockStatementKey struct{}

func (tr *advisoryLockTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s := data.SQL
	if strings.Contains(s, "advisory_lock") && !strings.Contains(s, "unlock") && !strings.Contains(s, "xact") {
		return context.WithValue(ctx, lockStatementKey{}, true)
	}
	return ctx
}

func (tr *advisoryLockTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if ctx.Value(lockStatementKey{}) != nil && data.Err == nil {
		tr.onLocked()
	}
}

// mustRenewPastExpiry waits until the database clock is a second past l's
// expiry as it is now, and fails t unless the keepalive has renewed l
// meanwhile: its row still live, under l's owner and fence, and l not lost.
func mustRenewPastExpiry(t *testing.T, ctx context.Context, direct *pgxpool.Pool, l *leases.Lease) {
	t.Helper()
	expiry := l.ExpiresAt()
	mustWait(t, 20*time.Second, "the database clock to pass the lease's expiry by a second", func() (bool, error) {
		var past bool
		err := direct.QueryRow(ctx, "SELECT clock_timestamp() > $1", expiry.Add(time.Second)).Scan(&past)
		return past, err
	})
	row, ok, err := readLease(ctx, direct, l.Name())
	if err != nil || !ok || !row.live() || row.Owner != l.Owner() || row.Fence != l.Fence() || l.Err() != nil {
		t.Fatalf("a second past the expiry of %v: row %+v (found %v, %v), lease err %v; want it renewed by the keepalive",
			expiry, row, ok, err, l.Err())
	}
}
