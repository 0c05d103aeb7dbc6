package pglock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// BenchmarkTryLockUnlock compares a TryLock+Unlock through pglock with the
// same work done by hand on the pool (acquire, pg_try_advisory_lock,
// pg_advisory_unlock, release), on names no other goroutine uses, with 1
// and 8 goroutines. pglock must cost no more than the raw path: both make
// the same two round trips, and the session monitor of a lock held this
// briefly never reads the socket (Unlock finds it waiting its start delay).
func BenchmarkTryLockUnlock(b *testing.B) {
	pool := newPool(b, pgtest.URL(b), 16)
	l := newLocker(b, pool)
	const perGoroutine = 1024
	names := make([][]string, 8)
	for g := range names {
		for i := range perGoroutine {
			names[g] = append(names[g], fmt.Sprintf("bench/%d/%d", g, i))
		}
	}
	paths := []struct {
		name string
		op   func(ctx context.Context, name string) error
	}{
		{"pgfence", func(ctx context.Context, name string) error {
			lk, err := l.TryLock(ctx, name)
			if err != nil {
				return err
			}
			return lk.Unlock(ctx)
		}},
		{"raw", func(ctx context.Context, name string) error { return rawTryLockUnlock(ctx, pool, name) }},
	}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			for _, goroutines := range []int{1, 8} {
				b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
					ctx := context.Background()
					var next atomic.Int64
					var wg sync.WaitGroup
					b.ResetTimer()
					for g := range goroutines {
						wg.Go(func() {
							for {
								i := next.Add(1) - 1
								if i >= int64(b.N) {
									return
								}
								if err := p.op(ctx, names[g][i%perGoroutine]); err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
				})
			}
		})
	}
}

// rawTryLockUnlock is the baseline: what a careful caller writes by hand.
func rawTryLockUnlock(ctx context.Context, pool *pgxpool.Pool, name string) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	key := Key(name)
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil { // what a raw user writes
		return err
	}
	if !ok {
		return ErrLocked
	}
	if err := conn.QueryRow(ctx, sqlUnlock, key).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("unlock of %q returned false", name)
	}
	return nil
}

// BenchmarkRefusedWait: a Lock whose 5ms deadline passes while another
// session holds the name, beside the same wait by hand on the pool
// (pg_advisory_lock under SET LOCAL lock_timeout = '5ms', in a
// transaction); and the same for a set of a free name and the held one
// (LockAll, which takes the free one first). It reports the connections
// each wait opened: none since a wait the server refused keeps its
// session (it destroyed it before; a set's until it gave back its names).
func BenchmarkRefusedWait(b *testing.B) {
	pool := newPool(b, pgtest.URL(b), 4)
	l := newLocker(b, pool)
	ctx := context.Background()
	holder, err := newLocker(b, newPool(b, pool.Config().ConnString(), 2)).Lock(ctx, "held")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = holder.Unlock(ctx) })
	free := "free" // taken before "held": a lower key
	for i := 0; Key(free) >= Key("held"); i++ {
		free = fmt.Sprintf("free%d", i)
	}
	// pgfence takes the names (one: Lock) with a 5ms deadline; raw waits
	// for the keys by hand under the same lock_timeout.
	pgfence := func(names ...string) func() error {
		return func() error {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
			defer cancel()
			var err error
			if len(names) == 1 {
				_, err = l.Lock(wctx, names[0])
			} else {
				_, err = l.LockAll(wctx, names...)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("LockAll%q = %v, want its deadline", names, err)
			}
			return nil
		}
	}
	raw := func(query string, arg any) func() error {
		return func() error {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5ms'`); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, query, arg)
			if pgerr.Code(err) != pgerr.LockNotAvailable {
				return fmt.Errorf("raw wait = %v, want SQLSTATE 55P03", err)
			}
			return nil
		}
	}
	for _, p := range []struct {
		name string
		op   func() error
	}{
		{"pgfence", pgfence("held")},
		{"raw", raw(`SELECT pg_advisory_xact_lock($1)`, Key("held"))},
		{"pgfence-set", pgfence(free, "held")},
		{"raw-set", raw(`SELECT count(pg_advisory_xact_lock(k)) FROM unnest($1::int8[]) AS k`, []int64{Key(free), Key("held")})},
	} {
		b.Run(p.name, func(b *testing.B) {
			opened := pool.Stat().NewConnsCount()
			for b.Loop() {
				if err := p.op(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(pool.Stat().NewConnsCount()-opened)/float64(b.N), "conns/op")
		})
	}
}
