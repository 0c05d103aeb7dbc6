package integration_test

import (
	"testing"

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
