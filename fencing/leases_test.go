package fencing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

// newClient returns a leases client over pool, closed when t ends.
func newClient(t *testing.T, pool *pgxpool.Pool) *leases.Client {
	t.Helper()
	c, err := leases.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close leases client: %v", err)
		}
	})
	return c
}

// TestKleppmannWithLeases is Kleppmann's scenario with two leases clients:
// A acquires and writes; A pauses past its TTL (its grant is made to expire by
// the database clock, as a long GC pause would); B acquires with a higher
// fence inside Run and writes through InTx. A's write with its old token is
// rejected, whether it comes before or after B's.
func TestKleppmannWithLeases(t *testing.T) {
	t.Parallel()
	for _, aAfterB := range []bool{false, true} {
		name := "A-before-B-writes"
		if aAfterB {
			name = "A-after-B-writes"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := setup(t)
			ca, cb := newClient(t, pool), newClient(t, pool)
			// A short TTL so that A's client renews (and finds its grant
			// gone) soon: it renews every TTL/3.
			la, err := ca.TryAcquire(bg, "job", 3*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			a := la.Token()
			if err := write(pool, a, 1, "A1"); err != nil {
				t.Fatalf("A's write while holding: %v", err)
			}
			// A is paused beyond its TTL.
			expire(t, pool, "job")

			aResult := make(chan error, 1)
			aWrite := func() { aResult <- write(pool, a, 1, "A2") }
			var b fencing.Token
			err = cb.Run(bg, "job", 30*time.Second, func(ctx context.Context, l *leases.Lease) error {
				b = l.Token()
				if !aAfterB {
					aWrite()
				}
				err := fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, upsertItem, 1, "B")
					return err
				})
				if aAfterB {
					aWrite()
				}
				return err
			})
			if err != nil {
				t.Fatalf("B: %v", err)
			}
			if b.Fence <= a.Fence {
				t.Fatalf("B's fence %d is not above A's %d", b.Fence, a.Fence)
			}
			wantStaleTx(t, <-aResult, a)
			wantItem(t, pool, 1, "B", b.Fence)
			// A's own client learns of the loss too (its renewal finds the
			// grant gone).
			select {
			case <-la.Done():
			case <-time.After(30 * time.Second): // TTL/3 renewal on a loaded machine
				t.Fatal("A's lease was not reported lost")
			}
		})
	}
}

// TestForceRelease: after an operator's ForceRelease, the former holder's
// token is stale at once — before its client has noticed.
func TestForceRelease(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	holder, operator := newClient(t, pool), newClient(t, pool)
	l, err := holder.TryAcquire(bg, "job", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tok := l.Token()
	if err := write(pool, tok, 1, "before"); err != nil {
		t.Fatal(err)
	}
	if err := operator.ForceRelease(bg, "job"); err != nil {
		t.Fatal(err)
	}
	err = write(pool, tok, 1, "after")
	wantStaleTx(t, err, tok)
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("write after ForceRelease: %v, want ErrStale", err)
	}
	wantItem(t, pool, 1, "before", tok.Fence)
	// Nobody holds it now; the next holder gets a higher fence and writes.
	l2, err := operator.TryAcquire(bg, "job", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(pool, l2.Token(), 1, "next"); err != nil {
		t.Fatalf("next holder's write: %v", err)
	}
	if err := l2.Release(bg); err != nil {
		t.Fatal(err)
	}
}
