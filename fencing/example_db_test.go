package fencing_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// exampleTB lets an Example, which has no *testing.T, use pgtest. pgtest
// calls only Helper, Cleanup, Fatalf and Errorf; the embedded nil TB
// supplies the rest of the interface and is never called.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                           {}
func (e *exampleTB) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) Errorf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// exampleDatabase returns a pool over a fresh migrated database and a
// function that closes it and drops the database.
func exampleDatabase() (*pgxpool.Pool, func()) {
	tb := &exampleTB{}
	pool := pgtest.Pool(tb)
	return pool, func() {
		for i := len(tb.cleanups) - 1; i >= 0; i-- {
			tb.cleanups[i]()
		}
	}
}
