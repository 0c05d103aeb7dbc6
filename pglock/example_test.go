package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/pglock"
)

func ExampleLocker_Do() {
	// In a service this is your DATABASE_URL; here, a throwaway database.
	databaseURL, drop := exampleDatabase()
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
	databaseURL, drop := exampleDatabase()
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

// exampleDatabase provisions a migrated database for an Example the way the
// tests do (pgtest), and returns a function that drops it. Examples have no
// *testing.T, so it hands pgtest a minimal testing.TB.
func exampleDatabase() (url string, drop func()) {
	tb := &exampleTB{}
	return pgtest.URL(tb), tb.cleanup
}

// exampleTB implements the part of testing.TB that pgtest uses. The
// embedded interface is nil: any other method would panic.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()      {}
func (*exampleTB) Name() string { return "Example" }
func (*exampleTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}
func (*exampleTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "example database: "+format+"\n", args...)
}
func (*exampleTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("example database: "+format, args...))
}
func (tb *exampleTB) Cleanup(f func()) { tb.cleanups = append(tb.cleanups, f) }

func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}
