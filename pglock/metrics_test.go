package pglock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pgfence/pgfence/internal/metrictest"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// Real acquires, waits and holds report the expected counts, attributes
// and durations: a waiter's wait covers the blocker's hold, the blocker's
// hold covers the time it was held.
func TestMetricsWaitAndHold(t *testing.T) {
	t.Parallel()
	mr := metrictest.New(t)
	pool, l := setup(t, WithMeterProvider(mr.MP))
	ctx := testContext(t)

	blocker, err := l.Lock(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	heldFrom := time.Now()
	waiterStart := time.Now()
	type result struct {
		lk  *Lock
		err error
	}
	waiter := make(chan result, 1)
	go func() {
		lk, err := l.Lock(ctx, "m")
		waiter <- result{lk, err}
	}()
	// The waiter is queued in PostgreSQL: an ungranted advisory lock.
	pgtest.WaitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND`+inThisDB).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	queuedAt := time.Now()
	if _, err := l.TryLock(ctx, "m"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryLock on a held lock = %v, want ErrLocked", err)
	}
	if _, err := l.TryRLock(ctx, "m"); !errors.Is(err, ErrLocked) {
		t.Fatalf("TryRLock on a held lock = %v, want ErrLocked", err)
	}
	const cancelAfter = 100 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, cancelAfter)
	_, err = l.Lock(cctx, "m")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with an ending context = %v, want DeadlineExceeded", err)
	}
	// Hold on a little longer, so that the hold is clearly measurable.
	const holdAtLeast = 200 * time.Millisecond
	time.Sleep(holdAtLeast - time.Since(heldFrom))
	unlockAt := time.Now()
	heldFor := unlockAt.Sub(heldFrom) // a lower bound of the blocker's hold
	if err := blocker.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-waiter
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	waitedFor := time.Since(waiterStart) // an upper bound of the waiter's wait
	if err := r.lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	shared, err := l.RLock(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if err := shared.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	got := mr.Collect(t)
	acquired := metrictest.Find(t, got, metricWait, "mode=exclusive,outcome=acquired,try=false")
	if acquired.Count != 2 {
		t.Errorf("exclusive acquired waits = %d, want 2", acquired.Count)
	}
	// The waiter was queued at queuedAt and granted after unlockAt: its
	// wait covers at least that part of the blocker's hold.
	if minWait := unlockAt.Sub(queuedAt); acquired.Max < minWait.Seconds() {
		t.Errorf("longest exclusive wait %.3fs, want at least %s (the blocker's hold while the waiter was queued)", acquired.Max, minWait)
	}
	if acquired.Max > waitedFor.Seconds() {
		t.Errorf("longest exclusive wait %.3fs, longer than the waiter ran (%s)", acquired.Max, waitedFor)
	}
	if p := metrictest.Find(t, got, metricWait, "mode=exclusive,outcome=locked,try=true"); p.Count != 1 {
		t.Errorf("TryLock locked = %d, want 1", p.Count)
	}
	if p := metrictest.Find(t, got, metricWait, "mode=shared,outcome=locked,try=true"); p.Count != 1 {
		t.Errorf("TryRLock locked = %d, want 1", p.Count)
	}
	// The wait runs from the call's own start, which comes after the
	// context's (a few ms on a loaded machine: the leases test saw 0.097s
	// for 100ms); half the timeout bounds that gap generously and still
	// fails a duration that does not cover the wait.
	if p := metrictest.Find(t, got, metricWait, "mode=exclusive,outcome=canceled,try=false"); p.Count != 1 || p.Sum < (cancelAfter/2).Seconds() {
		t.Errorf("canceled waits = %d lasting %.3fs, want 1 lasting about %s", p.Count, p.Sum, cancelAfter)
	}
	if p := metrictest.Find(t, got, metricWait, "mode=shared,outcome=acquired,try=false"); p.Count != 1 {
		t.Errorf("shared acquired = %d, want 1", p.Count)
	}
	if n := metrictest.Total(got, metricWait); n != 6 {
		t.Errorf("wait measurements = %v, want 6: %v", n, got[metricWait])
	}

	hold := metrictest.Find(t, got, metricHold, "mode=exclusive,outcome=unlocked")
	if hold.Count != 2 {
		t.Errorf("exclusive holds = %d, want 2", hold.Count)
	}
	if hold.Max < heldFor.Seconds() {
		t.Errorf("longest exclusive hold %.3fs, want at least %s (the blocker's)", hold.Max, heldFor)
	}
	if p := metrictest.Find(t, got, metricHold, "mode=shared,outcome=unlocked"); p.Count != 1 {
		t.Errorf("shared holds = %d, want 1", p.Count)
	}
	if n := metrictest.Total(got, metricLost); n != 0 {
		t.Errorf("lost = %v, want 0", n)
	}
	for name, ps := range got {
		for _, p := range ps {
			if strings.Contains(p.Attrs, attrName+"=") {
				t.Errorf("%s{%s}: name attribute without WithNameAttribute", name, p.Attrs)
			}
		}
	}
	assertIdle(t, pool)
}

// A lock lost to pg_terminate_backend counts once as lost, cause
// session_ended, and its hold ends as lost; with WithNameAttribute every
// point carries the name.
func TestMetricsLostWithName(t *testing.T) {
	t.Parallel()
	mr := metrictest.New(t)
	pool, l := setup(t, WithMeterProvider(mr.MP), WithNameAttribute(true))
	watching := watchStarts(l)
	ctx := testContext(t)
	lk, err := l.Lock(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	awaitWatch(t, watching)
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int32(lk.pid)).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
	}
	select {
	case <-lk.Done():
	case <-time.After(10 * time.Second): // promised about 1s; generous for a loaded machine
		t.Fatal("Done not closed after pg_terminate_backend")
	}
	// Recorded before Done closed.
	got := mr.Collect(t)
	if p := metrictest.Find(t, got, metricLost, "cause=session_ended,mode=exclusive,name=victim"); p.Sum != 1 {
		t.Errorf("lost = %v, want 1", p.Sum)
	}
	if p := metrictest.Find(t, got, metricHold, "mode=exclusive,name=victim,outcome=lost"); p.Count != 1 {
		t.Errorf("lost holds = %d, want 1", p.Count)
	}
	if p := metrictest.Find(t, got, metricWait, "mode=exclusive,name=victim,outcome=acquired,try=false"); p.Count != 1 {
		t.Errorf("waits = %d, want 1", p.Count)
	}
	if p := metrictest.Find(t, got, metricHeld, "mode=exclusive"); p.Sum != 0 {
		t.Errorf("held after the loss = %v, want 0", p.Sum)
	}
	if err := lk.Unlock(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("Unlock after loss = %v, want ErrLost", err)
	}
	// Unlock after the loss records nothing more.
	got = mr.Collect(t)
	if n := metrictest.Total(got, metricHold); n != 1 {
		t.Errorf("hold measurements after Unlock = %v, want still 1", n)
	}
	if n := metrictest.Total(got, metricLost); n != 1 {
		t.Errorf("lost after Unlock = %v, want still 1", n)
	}
}

// pgfence.lock.held counts the Locks held now, by mode; a set counts once.
func TestMetricsHeld(t *testing.T) {
	t.Parallel()
	mr := metrictest.New(t)
	_, l := setup(t, WithMeterProvider(mr.MP))
	ctx := testContext(t)
	held := func(want map[string]float64) {
		t.Helper()
		got := mr.Collect(t)
		for attrs, n := range want {
			if p := metrictest.Find(t, got, metricHeld, attrs); p.Sum != n {
				t.Errorf("held %s = %v, want %v", attrs, p.Sum, n)
			}
		}
	}
	a, err := l.Lock(ctx, "held/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.RLock(ctx, "held/b")
	if err != nil {
		t.Fatal(err)
	}
	set, err := l.TryLockAll(ctx, "held/c", "held/d")
	if err != nil {
		t.Fatal(err)
	}
	held(map[string]float64{"mode=exclusive": 2, "mode=shared": 1})
	for _, lk := range []*Lock{a, b, set} {
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held(map[string]float64{"mode=exclusive": 0, "mode=shared": 0})
}

// Without WithMeterProvider a Locker records on the global provider (a
// no-op until the application installs one): it works, and records
// nothing on another Locker's provider. A nil provider is invalid.
func TestMetricsDefaultProvider(t *testing.T) {
	t.Parallel()
	mr := metrictest.New(t)
	pool := newPool(t, pgtest.URL(t), 4)
	quiet := newLocker(t, pool)
	counted := newLocker(t, pool, WithMeterProvider(mr.MP))
	ctx := testContext(t)
	for range 3 {
		lk, err := quiet.TryLock(ctx, "default")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lk, err := counted.TryLock(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got := mr.Collect(t)
	if n := metrictest.Total(got, metricWait); n != 1 {
		t.Errorf("wait measurements = %v, want 1 (only the Locker with the provider)", n)
	}
	if n := metrictest.Total(got, metricHold); n != 1 {
		t.Errorf("hold measurements = %v, want 1", n)
	}

	if _, err := New(pool, WithMeterProvider(nil)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "WithMeterProvider") {
		t.Errorf("New with WithMeterProvider(nil) = %v, want ErrInvalid naming the option", err)
	}
}

// BenchmarkRecordNoProvider measures what the instrumentation of one
// TryLock+Unlock (a wait and a hold measurement) costs without a database,
// on the global provider nobody configured, on the no-op provider, and on
// an SDK provider with a ManualReader. The per-operation figure to compare
// with BenchmarkTryLockUnlock's round trips.
func BenchmarkRecordNoProvider(b *testing.B) {
	providers := []struct {
		name string
		mp   metric.MeterProvider
	}{
		{"global-unset", otel.GetMeterProvider()},
		{"noop", noop.NewMeterProvider()},
		{"sdk", metrictest.New(b).MP},
	}
	for _, p := range providers {
		for _, nameAttr := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/name=%v", p.name, nameAttr), func(b *testing.B) {
				m := newMetrics(p.mp, nameAttr, discard)
				ctx := context.Background()
				start := time.Now()
				b.ReportAllocs()
				for b.Loop() {
					now := time.Now()
					m.recordWait(ctx, "bench", modeTryLock, waitAcquired, start, now)
					m.recordHold("bench", false, false, start, now)
				}
			})
		}
	}
}

var discard = slog.New(slog.DiscardHandler)
