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
		const clients, goroutines, rounds, maxBatches = 3, 6, 5, 20
		var (
			inside atomic.Int32
			grants atomic.Int32
		)
		cs := make([]*leases.Client, clients)
		for i := range cs {
			cs[i] = mustClient(t, d.open(t, pu.String(), "serializable"), "c"+string(rune('a'+i)),
				leases.WithPollInterval(100*time.Millisecond), leases.WithLogger(logger))
		}
		retried := func() bool {
			logMu.Lock()
			defer logMu.Unlock()
			return bytes.Contains(logs.Bytes(), []byte("retrying a statement after a serialization failure"))
		}
		// Batches of contention until a serialization failure has been met
		// (and retried): how soon one comes depends on the machine and the
		// driver, so the test contends until it does, within a bound.
		batches := 0
		for ; batches < maxBatches && (batches == 0 || !retried()); batches++ {
			var wg sync.WaitGroup
			for i := range goroutines {
				c := cs[i%clients]
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
			wg.Wait()
			if t.Failed() {
				return
			}
		}
		if n := grants.Load(); n != int32(batches*goroutines*rounds) {
			t.Errorf("%d grants, want %d", n, batches*goroutines*rounds)
		}
		if !retried() {
			t.Errorf("no statement was retried in %d batches: the clients did not contend under SERIALIZABLE", batches)
		}
	})
}

// writerFunc is an io.Writer made of a function.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
