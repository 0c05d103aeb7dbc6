package fencing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgfence/pgfence/fencing"
)

// rejected returns pgfence.fenced_writes.rejected by its reason attribute.
func rejected(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect metrics: %v", err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "pgfence.fenced_writes.rejected" {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic {
				t.Fatalf("%s: data %T, want a monotonic int64 sum", m.Name, m.Data)
			}
			if m.Unit != "{write}" {
				t.Errorf("%s: unit %q, want {write}", m.Name, m.Unit)
			}
			for _, dp := range sum.DataPoints {
				reason, _ := dp.Attributes.Value("reason")
				out[reason.AsString()] += dp.Value
			}
		}
	}
	return out
}

// InTx counts each rejection on the global MeterProvider, by reason;
// successful writes and rejections of statements run on Begin's
// transaction (plain SQL) are not counted.
//
// Not parallel: it installs a global MeterProvider, and every other test
// of the package is parallel, so none of them runs meanwhile.
func TestMetricsRejectedWrites(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	otel.SetMeterProvider(mp)
	t.Cleanup(func() {
		otel.SetMeterProvider(noop.NewMeterProvider())
		_ = mp.Shutdown(context.Background())
	})

	pool := setup(t)
	old := grant(t, pool, "metrics", time.Minute)
	if err := write(pool, old, 1, "a"); err != nil {
		t.Fatal(err)
	}
	expire(t, pool, "metrics")
	cur := grant(t, pool, "metrics", time.Minute)
	if err := write(pool, cur, 1, "b"); err != nil {
		t.Fatal(err)
	}
	if got := rejected(t, reader); len(got) != 0 {
		t.Fatalf("rejected after successful writes = %v, want nothing", got)
	}

	for range 2 {
		wantStaleTx(t, write(pool, old, 1, "stale"), old)
	}
	// A rejection InTx cannot see: a statement on Begin's transaction.
	tx, err := fencing.Begin(bg, pool, old)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(bg, upsertItem, 1, "plain")
	_ = tx.Rollback(bg)
	wantStale(t, err)
	// No token: fn clears the declaration before writing.
	err = fencing.InTx(bg, pool, cur, func(tx pgx.Tx) error {
		if _, err := tx.Exec(bg, `SELECT set_config('pgfence.token', '', true)`); err != nil {
			return err
		}
		_, err := tx.Exec(bg, upsertItem, 1, "no token")
		return err
	})
	if !errors.Is(err, fencing.ErrNoToken) {
		t.Fatalf("InTx writing without a token = %v, want ErrNoToken", err)
	}

	got := rejected(t, reader)
	if got["stale"] != 2 || got["no_token"] != 1 || len(got) != 2 {
		t.Errorf("rejected = %v, want map[no_token:1 stale:2]", got)
	}
	wantItem(t, pool, 1, "b", cur.Fence)
}
