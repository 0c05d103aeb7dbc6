package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pglock"
)

// newLocker is pglock.New, failing t on an error.
func newLocker(t testing.TB, pool *pgxpool.Pool, opts ...pglock.Option) *pglock.Locker {
	t.Helper()
	l, err := pglock.New(pool, opts...)
	if err != nil {
		t.Fatalf("pglock.New: %v", err)
	}
	return l
}

// awaitLocksReleased waits until the terminated backends pids hold no lock:
// a backend sends the FATAL message that tells its client of the loss
// before it exits and releases its session's advisory locks.
func awaitLocksReleased(t *testing.T, admin *pgxpool.Pool, pids ...int32) {
	t.Helper()
	mustWait(t, 30*time.Second, "the terminated backends to release their locks", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var held bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE pid = ANY ($1))`, pids).Scan(&held)
		return !held, err
	})
}
