package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/pglock"
)

func ExampleLocker_Do() {
	// In a service this is your DATABASE_URL; here, a throwaway database.
	databaseURL, drop := pgtest.ExampleURL()
	defer drop()

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	locker := pglock.New(pool)

	err = locker.Do(ctx, "billing/nightly-report", func(ctx context.Context) error {
		// Only one process runs this at a time. ctx is cancelled, with
		// cause pglock.ErrLost, if the lock's session dies.
		_, err := locker.TryLock(ctx, "billing/nightly-report")
		fmt.Println("held elsewhere:", errors.Is(err, pglock.ErrLocked))
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// held elsewhere: true
	// done: <nil>
}

func ExampleLocker_TryLock() {
	databaseURL, drop := pgtest.ExampleURL()
	defer drop()

	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	locker := pglock.New(pool, pglock.WithLivenessCheck(time.Second, 3*time.Second))

	lk, err := locker.TryLock(ctx, "migrations")
	if errors.Is(err, pglock.ErrLocked) {
		fmt.Println("another replica is migrating")
		return
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lk.Unlock(context.WithoutCancel(ctx))

	// Work while watching for loss.
	select {
	case <-lk.Done():
		fmt.Println("lost:", lk.Err())
	default:
		fmt.Printf("holding %s (key %d)\n", lk.Name(), lk.Key())
	}
	// Output:
	// holding migrations (key -3058229681751119483)
}

func ExampleKey() {
	// The key an operator passes to pg_advisory_lock; the same as
	// SELECT pgfence.lock_key('billing').
	fmt.Println(pglock.Key("billing"))
	// Output:
	// 906850720199613079
}
