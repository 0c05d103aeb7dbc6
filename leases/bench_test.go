package leases

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/benchsql"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// BenchmarkTryAcquireRelease measures a grant plus a release, uncontended
// (each goroutine its own lease name), through the client and with the
// minimal hand-written lease (internal/benchsql) through the same kind of
// pool. `pgfence bench` runs the same comparison interleaved.
func BenchmarkTryAcquireRelease(b *testing.B) {
	for _, g := range []int{1, 8} {
		b.Run(fmt.Sprintf("pgfence/goroutines=%d", g), func(b *testing.B) {
			pool := pgtest.Pool(b)
			c, err := New(pool)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			parallel(b, g, func(ctx context.Context, name string) error {
				l, err := c.TryAcquire(ctx, name, time.Minute)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			})
		})
		b.Run(fmt.Sprintf("raw/goroutines=%d", g), func(b *testing.B) {
			pool := pgtest.Pool(b)
			if _, err := pool.Exec(context.Background(), benchsql.Schema); err != nil {
				b.Fatal(err)
			}
			parallel(b, g, func(ctx context.Context, name string) error {
				return rawAcquireRelease(ctx, pool, name)
			})
		})
	}
}

func rawAcquireRelease(ctx context.Context, pool *pgxpool.Pool, name string) error {
	var fence int64
	if err := pool.QueryRow(ctx, benchsql.Grant, name, "raw-"+name, time.Minute.Milliseconds()).Scan(&fence); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, benchsql.Release, name, fence)
	return err
}

// parallel runs b.N calls of op split over g goroutines, each with its own
// lease name.
func parallel(b *testing.B, g int, op func(ctx context.Context, name string) error) {
	ctx := context.Background()
	names := make([]string, g)
	for i := range names {
		names[i] = fmt.Sprintf("bench/%d", i)
	}
	b.ResetTimer()
	pgtest.Split(b, g, func(i, _ int) error { return op(ctx, names[i]) })
}

// BenchmarkHandover measures release → the waiting acquirer (another
// client) holds the lease, with notifications and polling only.
func BenchmarkHandover(b *testing.B) {
	for _, mode := range []struct {
		name string
		opts []Option
	}{
		{"notify", nil},
		{"poll-only", []Option{WithNotifications(false)}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			url := pgtest.URL(b)
			ctx := context.Background()
			a, err := New(pgtest.PoolFor(b, url))
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			waiting := make(chan struct{}, 1)
			w, err := New(pgtest.PoolFor(b, url), mode.opts...)
			if err != nil {
				b.Fatal(err)
			}
			hookWait(w, func(string) { signal(waiting) })
			defer w.Close()
			if mode.opts == nil {
				w.startListener()
				<-w.hooks.listening
			}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				la, err := a.TryAcquire(ctx, "handover", time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				got := make(chan *Lease, 1)
				go func() {
					l, err := w.Acquire(ctx, "handover", time.Minute)
					if err != nil {
						b.Error(err)
					}
					got <- l
				}()
				<-waiting
				begin := time.Now()
				if err := la.Release(ctx); err != nil {
					b.Fatal(err)
				}
				lw := <-got
				took = append(took, time.Since(begin))
				if lw == nil {
					b.FailNow()
				}
				if err := lw.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2])/1e6, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100])/1e6, "p99-ms")
		})
	}
}

// BenchmarkHeldLeases holds 10,000 leases on one client with a 3s TTL and
// reports the heap each costs, the time of one batched renewal of all of
// them, and the CPU share of the process while they are kept alive. Run
// with -benchtime=1x.
func BenchmarkHeldLeases(b *testing.B) {
	const n = 10000
	const ttl = 3 * time.Second
	pool := pgtest.Pool(b)
	c, err := New(pool)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for range b.N {
		var before runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		held := make([]*Lease, n)
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := g; i < n; i += 8 {
					l, err := c.TryAcquire(ctx, fmt.Sprintf("held/%05d", i), ttl)
					if err != nil {
						b.Error(err)
						return
					}
					held[i] = l
				}
			})
		}
		wg.Wait()
		var after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/lease")

		begin := time.Now()
		// Some rows may be skipped as busy: the client's own keepalive
		// renews them concurrently.
		rs := make([]renewal, n)
		for i, l := range held {
			rs[i] = renewal{l, ttl}
		}
		if again := c.renewBatch(ctx, rs, lostRenewRejected); again {
			b.Log("batched renewal skipped busy rows")
		}
		b.ReportMetric(float64(time.Since(begin))/1e6, "renew-all-ms")

		cpu0 := cpuTime()
		wall0 := time.Now()
		timer := time.NewTimer(2 * ttl)
		<-timer.C
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Since(wall0))*100, "cpu-%")
		for _, l := range held {
			if l.Err() != nil {
				b.Fatalf("%v lost while kept alive: %v", l, l.Err())
			}
		}
		if _, err := c.releaseBatch(ctx, "release", held); err != nil {
			b.Fatal(err)
		}
		c.mu.Lock()
		for _, l := range held {
			c.dropLocked(l)
			l.state = stateReleased
			l.cancel(ErrReleased)
		}
		c.mu.Unlock()
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
