package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promises of pgfence.bump_fence (docs/design.md, "Fences"): it raises
// pgfence.fence_floor to gap above every fence in the table and above the
// clock, so that every later fence exceeds every fence issued while a lost
// history's clock was less than gap ahead; and it refuses a floor above
// 2^62, which keeps the rest of bigint for the clock, changing nothing.
//
// A bump measured only against fences drawn from the clock cannot tell
// "above every fence" from "above the clock": here a lease's stored fence
// is far ahead of the clock, as a grant after an earlier bump leaves it.

func TestBumpFenceExceedsEveryFence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(t, pgtest.URL(t))
	floor := func() int64 {
		t.Helper()
		var v int64
		if err := conn.QueryRow(ctx, `SELECT floor FROM pgfence.fence_floor`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	grant(t, ctx, conn, "ahead", time.Minute)
	ahead := grant(t, ctx, conn, "plain", time.Minute) + 100*time.Hour.Microseconds()
	setFence(t, ctx, conn, "ahead", ahead)
	gap := time.Hour.Microseconds()
	var bumped int64
	if err := conn.QueryRow(ctx, `SELECT pgfence.bump_fence($1)`, gap).Scan(&bumped); err != nil {
		t.Fatalf("bump_fence(%d): %v", gap, err)
	}
	if bumped < ahead+gap {
		t.Errorf("bump_fence(%d) = %d, want at least the highest fence %d + the gap", gap, bumped, ahead+gap)
	}
	if got := floor(); got != bumped {
		t.Errorf("floor %d, want what bump_fence returned, %d", got, bumped)
	}
	if f := grant(t, ctx, conn, "new", time.Minute); f <= bumped {
		t.Errorf("a new lease's fence after the bump is %d, want above the floor %d", f, bumped)
	}

	// Too high: refused, and nothing changes.
	for _, g := range []int64{int64(1) << 62, int64(1)<<62 - bumped} {
		before := floor()
		var got int64
		err := conn.QueryRow(ctx, `SELECT pgfence.bump_fence($1)`, g).Scan(&got)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "22003" {
			t.Errorf("bump_fence(%d) = %d, %v; want SQLSTATE 22003 (a floor above 2^62)", g, got, err)
		}
		if after := floor(); after != before {
			t.Errorf("a refused bump_fence(%d) moved the floor from %d to %d", g, before, after)
		}
	}
}
