package pgtest

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// MainWithURL is Main for a package whose Examples connect the way an
// application does, to os.Getenv(env) (e.g. DATABASE_URL), so that their
// code can be copied as is: it provisions one migrated database, sets env
// to its URL for the whole run, runs the tests, and drops the database.
//
//	func TestMain(m *testing.M) { pgtest.MainWithURL(m, "DATABASE_URL") }
func MainWithURL(m *testing.M, env string, opts ...goleak.Option) {
	url, drop := ExampleURL()
	if err := os.Setenv(env, url); err != nil {
		panic("pgtest: set " + env + ": " + err.Error())
	}
	code := m.Run()
	drop()
	os.Exit(finish(code, opts))
}
