package leases

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestFailedReleaseEndedLater: a Release whose statement fails (here its
// context had ended; in production a network error) releases the lease
// locally at once, and the Client ends the grant in the background, so the
// next holder does not wait out the TTL — nor after Close.
func TestFailedReleaseEndedLater(t *testing.T) {
	t.Parallel()
	for _, byClose := range []bool{false, true} {
		name := map[bool]string{false: "in the background", true: "by Close"}[byClose]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, pool := setup(t)
			ctx := testContext(t)
			l, err := c.TryAcquire(ctx, "job", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			gone, cancel := context.WithCancel(ctx)
			cancel()
			if err := l.Release(gone); !errors.Is(err, context.Canceled) {
				t.Fatalf("Release under an ended context = %v, want context.Canceled", err)
			}
			if !errors.Is(l.Err(), ErrReleased) {
				t.Fatalf("Err after the failed Release = %v, want ErrReleased (released locally)", l.Err())
			}
			ended := func() bool {
				var over bool
				err := pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = $1 AND fence = $2`,
					l.Name(), l.Fence()).Scan(&over)
				if err != nil {
					t.Fatalf("read the grant: %v", err)
				}
				return over
			}
			if byClose {
				if err := c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if !ended() {
					t.Fatal("the grant is still live after Close")
				}
				return
			}
			// Well within the hour's TTL; the release timeout is 5s.
			pgtest.WaitFor(t, 20*time.Second, "the grant to be ended", ended)
			if err := l.Release(ctx); err != nil {
				t.Errorf("Release again after the grant was ended = %v, want nil", err)
			}
		})
	}
}
