package pgtest

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/redact/redacttest"
)

// A PGFENCE_TEST_DATABASE_URL that does not parse is reported without its
// password: CI logs are read by more people than the secret is meant for.
func TestWithDatabaseHidesPassword(t *testing.T) {
	failed := 0
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		if !strings.HasPrefix(c.DSN, "postgres://") {
			continue
		}
		_, err := withDatabase(c.DSN, "pgfence_test_x")
		if err == nil {
			continue
		}
		failed++
		if leak := redacttest.Leak(err.Error(), c.Passwords); leak != "" {
			t.Errorf("%s: %q leaks %q", c.Name, err, leak)
		}
	}
	if failed == 0 {
		t.Fatal("no URL of the table failed to parse: the test shows nothing")
	}
}

// PoolFor fails on every connection string of the table (none reaches a
// server), and says why without a piece of the password.
func TestPoolForHidesPassword(t *testing.T) {
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		msg := redacttest.Fatal(t, func(tb testing.TB) { PoolFor(tb, c.DSN) })
		if msg == "" {
			t.Errorf("%s: PoolFor did not fail", c.Name)
			continue
		}
		if leak := redacttest.Leak(msg, c.Passwords); leak != "" {
			t.Errorf("%s: PoolFor says %q: leaks %q", c.Name, msg, leak)
		}
	}
}

// A PGFENCE_TEST_DATABASE_URL that does not work is reported without its
// password: it is the first message a misconfigured CI shows.
func TestServerFromURLHidesPassword(t *testing.T) {
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		t.Setenv(EnvURL, c.DSN)
		_, err := serverFromURL()
		if err == nil {
			t.Errorf("%s: serverFromURL did not fail", c.Name)
			continue
		}
		if leak := redacttest.Leak(err.Error(), c.Passwords); leak != "" {
			t.Errorf("%s: %q leaks %q", c.Name, err, leak)
		}
	}
}
