package pgfencetest_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/redact/redacttest"
	"github.com/pgfence/pgfence/pgfencetest"
)

// ProxyURL's complaint about a connection string it cannot use shows no
// piece of the string's password: test logs are read by more people than
// the secret is meant for.
func TestProxyURLHidesPassword(t *testing.T) {
	t.Parallel()
	failed := 0
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		msg := redacttest.Fatal(t, func(tb testing.TB) { pgfencetest.ProxyURL(tb, c.DSN) })
		if msg == "" {
			continue
		}
		failed++
		if leak := redacttest.Leak(msg, c.Passwords); leak != "" {
			t.Errorf("%s: ProxyURL says %q: leaks %q", c.Name, msg, leak)
		}
	}
	if failed == 0 {
		t.Fatal("no connection string of the table made ProxyURL fail: the test shows nothing")
	}
}
