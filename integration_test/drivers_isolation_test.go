package integration_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
)

// Under a default isolation of SERIALIZABLE (a role's or database's
// setting, here the connection's options), contending clients of every
// driver get every grant: the Client runs a statement that failed to
// serialize (40001) again, reading the SQLSTATE from lib/pq's errors as
// from pgx's. Its warning proves that the setting took effect and the
// contention produced such failures.
func TestDriversSerializableDefault(t *testing.T) {
	forDrivers(t, func(t *testing.T, d driver, u string, admin *pgxpool.Pool) {
		ctx := ctxT(t, 2*time.Minute)
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		q := pu.Query()
		q.Set("options", "--default_transaction_isolation=serializable") // no space: sqlHandle encodes the URL again
		pu.RawQuery = q.Encode()
		var (
			logMu sync.Mutex
			logs  bytes.Buffer
		)
		logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			logMu.Lock()
			defer logMu.Unlock()
			return logs.Write(p)
		}), nil))
		const clients, goroutines, rounds = 3, 6, 5
		var (
			wg     sync.WaitGroup
			inside atomic.Int32
			grants atomic.Int32
		)
		for i := range clients {
			c := mustClient(t, d.open(t, pu.String(), "serializable"), "c"+string(rune('a'+i)),
				leases.WithPollInterval(100*time.Millisecond), leases.WithLogger(logger))
			for range goroutines / clients {
				wg.Go(func() {
					for range rounds {
						err := c.Run(ctx, "contended", 5*time.Second, func(context.Context, *leases.Lease) error {
							if n := inside.Add(1); n != 1 {
								t.Errorf("%d holders at once", n)
							}
							grants.Add(1)
							time.Sleep(time.Millisecond) // hold it a moment: widen any overlap
							inside.Add(-1)
							return nil
						})
						if err != nil {
							t.Errorf("Run: %v", err)
							return
						}
					}
				})
			}
		}
		wg.Wait()
		if n := grants.Load(); n != goroutines*rounds {
			t.Errorf("%d grants, want %d", n, goroutines*rounds)
		}
		logMu.Lock()
		defer logMu.Unlock()
		if !bytes.Contains(logs.Bytes(), []byte("retrying a statement after a serialization failure")) {
			t.Errorf("no statement was retried: the clients did not contend under SERIALIZABLE (logs:\n%s)", logs.String())
		}
	})
}

// writerFunc is an io.Writer made of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
