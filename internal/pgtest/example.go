package pgtest

import (
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ExampleURL provisions a fresh migrated database for an Example function,
// which has no *testing.T, and returns its URL and a function that drops it.
// It panics when no database can be had: an Example has no other way to
// fail, and the panic fails the test binary loudly rather than skipping.
func ExampleURL() (url string, drop func()) {
	tb := &exampleTB{}
	return URL(tb), tb.cleanup
}

// ExamplePool is ExampleURL with a pool over the database; drop closes the
// pool and drops the database.
func ExamplePool() (pool *pgxpool.Pool, drop func()) {
	tb := &exampleTB{}
	return Pool(tb), tb.cleanup
}

// exampleTB is the part of testing.TB that this package calls. The embedded
// interface is nil: any other method would panic.
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
