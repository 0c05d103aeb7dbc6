package integration_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TestGrantCutWhileWaiting (scenario: the connection of a grant that
// waits for an expired holder's open fenced transaction is cut, and the
// way to the server stays down — a proxy or pooler gone, a network
// partition — so that pgx's cancel request, which it sends when a
// connection fails, cannot arrive; the holder then commits). A backend
// waiting for a lock reads nothing from its client: it stays queued,
// takes the lease when the holder's transaction ends and commits the
// grant, whose answer nobody reads. The call failed long before, so the
// lease is held by nobody until its TTL. With the server's
// client_connection_check_interval, which docs/production.md recommends,
// the wait ends once the server sees the connection closed, and nothing is
// held. Without it the test shows the hazard the docs name; should
// PostgreSQL end such waits by itself one day, it fails, and the docs
// need changing.
func TestGrantCutWhileWaiting(t *testing.T) {
	t.Parallel()
	for _, check := range []bool{false, true} {
		t.Run(fmt.Sprintf("client_connection_check_interval=%t", check), func(t *testing.T) {
			t.Parallel()
			u := setup(t)
			admin := newPool(t, u, "admin")
			ctx := ctxT(t, time.Minute)
			holder := ghostInFencedWrite(t, ctx, u, admin)
			px := proxyTo(t, admin)
			pool := newPool(t, px.URL(t, u), "taker", func(cfg *pgxpool.Config) {
				if check {
					cfg.ConnConfig.RuntimeParams["client_connection_check_interval"] = "1s"
				}
			})
			done, cancel := tryInBackground(ctx, newLeases(t, pool, "taker"))
			defer cancel()
			waiting := takerWaiting(ctx, admin)
			mustWait(t, 30*time.Second, "the grant to wait for the fence lock", waiting)

			px.Close() // the connections cut, and no new one accepted
			select {
			case err := <-done:
				t.Logf("TryAcquire, its connection cut: %v", err)
			case <-time.After(30 * time.Second): // a round trip to learn of the cut, on a loaded machine
				t.Fatal("TryAcquire did not return after its connection was cut")
			}
			if check {
				mustWait(t, 30*time.Second, "the server to end the cut grant's wait", func() (bool, error) {
					ok, err := waiting()
					return !ok, err
				})
			} else if ok, err := waiting(); err != nil || !ok {
				t.Fatalf("without client_connection_check_interval the cut grant no longer waits (%v): the hazard this test shows is gone; update docs/production.md", err)
			}
			if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
				t.Fatal(err)
			}
			mustWait(t, 30*time.Second, "the taker's sessions to end", func() (bool, error) {
				n, err := countSessions(ctx, admin, "taker")
				return n == 0, err
			})
			row, _, err := readLease(ctx, admin, "res")
			if err != nil {
				t.Fatal(err)
			}
			orphan := row.live() && strings.HasPrefix(row.Owner, "taker")
			switch {
			case check && orphan:
				t.Fatalf("with client_connection_check_interval the cut grant committed: the lease is held by %q, whom nobody knows", row.Owner)
			case !check && !orphan:
				t.Fatalf("without client_connection_check_interval the cut grant did not commit (lease %+v): the hazard this test shows is gone; update docs/production.md", row)
			case orphan:
				t.Logf("without client_connection_check_interval: the lease is held by %q, whom nobody knows, until %v", row.Owner, row.ExpiresAt)
			}
		})
	}
}
