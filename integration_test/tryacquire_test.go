// TryAcquire must answer "held" at once even while the holder is inside a
// fenced transaction (the guard holds the lease's fence lock until commit).
package integration_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

func TestTryAcquireDoesNotWaitForHoldersFencedTx(t *testing.T) {
	t.Parallel()
	u := setup(t)
	pool := newPool(t, u, "p")
	protectedTable(t, pool, "resource", "id int PRIMARY KEY")
	holder := newLeases(t, pool, "holder")
	other := newLeases(t, pool, "other")
	ctx := ctxT(t, time.Minute)
	l, err := holder.Acquire(ctx, "x", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	tx, err := fencing.Begin(ctx, pool, l.Token())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "INSERT INTO resource (id) VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = other.TryAcquire(tctx, "x", 10*time.Second)
	if d := time.Since(start); !errors.Is(err, leases.ErrHeld) || d > time.Second {
		t.Fatalf("TryAcquire of a live lease whose holder is in a fenced transaction: %v after %v, want ErrHeld at once", err, d)
	}
}
