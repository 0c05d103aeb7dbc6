package pgfencetest_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/pgfence/pgfence/internal/redact/redacttest"
	"github.com/pgfence/pgfence/pgfencetest"
)

// fatalTB is t, but for Fatalf, which records the message and ends the
// goroutine as testing.T's does, without failing the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// ProxyURL's complaint about a connection string it cannot use shows no
// piece of the string's password: test logs are read by more people than
// the secret is meant for.
func TestProxyURLHidesPassword(t *testing.T) {
	t.Parallel()
	failed := 0
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		tb := &fatalTB{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			pgfencetest.ProxyURL(tb, c.DSN)
		}()
		<-done
		if tb.msg == "" {
			continue
		}
		failed++
		if leak := redacttest.Leak(tb.msg, c.Passwords); leak != "" {
			t.Errorf("%s: ProxyURL says %q: leaks %q", c.Name, tb.msg, leak)
		}
	}
	if failed == 0 {
		t.Fatal("no connection string of the table made ProxyURL fail: the test shows nothing")
	}
}
