package leases_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// examplePool stands in for the application's own pool in the examples: a
// pool over a fresh migrated test database, closed by the returned func.
func examplePool() (*pgxpool.Pool, func()) {
	tb := &exampleTB{}
	pool := pgtest.Pool(tb)
	return pool, func() {
		for _, f := range slices.Backward(tb.cleanups) {
			f()
		}
	}
}

// exampleTB is the little of testing.TB that pgtest needs, for examples.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (*exampleTB) Helper()                        {}
func (*exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (*exampleTB) Errorf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (e *exampleTB) Cleanup(f func())             { e.cleanups = append(e.cleanups, f) }
