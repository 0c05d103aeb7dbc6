package fencing_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgfence/pgfence/fencing"
)

// A fn that panics rolls the transaction back, and InTx's span says so:
// it ends with an error status, not as a transaction that went through.
// The panic itself goes on unchanged.
func TestSpanOfPanickingFn(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	traced := fencing.WithTracerProvider(tp)

	pool := setup(t)
	tok := grant(t, pool, "panicky", time.Minute)
	db := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
	t.Cleanup(func() { _ = db.Close() })

	type boom struct{ msg string }
	panics := func(call func()) (v any) {
		defer func() { v = recover() }()
		call()
		return nil
	}
	for _, c := range []struct {
		name string
		call func()
	}{
		{"InTx", func() {
			_ = fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
				if _, err := tx.Exec(bg, upsertItem, 1, "written"); err != nil {
					return err
				}
				panic(boom{"fn panicked"})
			}, traced)
		}},
		{"InDBTx", func() {
			_ = fencing.InDBTx(bg, db, tok, func(tx *sql.Tx) error {
				if _, err := tx.ExecContext(bg, upsertItem, 1, "written"); err != nil {
					return err
				}
				panic(boom{"fn panicked"})
			}, traced)
		}},
	} {
		if v := panics(c.call); v != (boom{"fn panicked"}) {
			t.Errorf("%s: recovered %v, want fn's panic value unchanged", c.name, v)
		}
	}
	var n int
	if err := pool.QueryRow(bg, `SELECT count(*) FROM items`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("items after panicking fns: %d, %v; want 0 rows (rolled back)", n, err)
	}
	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2", len(ended))
	}
	for i, s := range ended {
		if s.Status().Code != codes.Error {
			t.Errorf("span %d (%s) of a panicking fn: status %+v, want an error", i, s.Name(), s.Status())
		}
	}
}
