package pgfencetest_test

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/redact/redacttest"
	"github.com/pgfence/pgfence/pgfencetest"
)

// TestInvalidInput: a helper given nil or empty input fails the test with
// a message naming the argument, before it touches anything; it does not
// panic, and does not go on to fail later with an obscure error.
func TestInvalidInput(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		f    func(testing.TB)
		want string
	}{
		{"PauseProcess nil", func(tb testing.TB) { pgfencetest.PauseProcess(tb, nil) }, "PauseProcess: the process is nil"},
		{"PauseContainer empty", func(tb testing.TB) { pgfencetest.PauseContainer(tb, "") }, "PauseContainer: the container ID is empty"},
		{"CutContainerNetwork empty", func(tb testing.TB) { pgfencetest.CutContainerNetwork(tb, "") }, "CutContainerNetwork: the container ID is empty"},
		{"NewProxy empty", func(tb testing.TB) { pgfencetest.NewProxy(tb, "") }, "NewProxy: the target must be host:port"},
		{"NewProxy no port", func(tb testing.TB) { pgfencetest.NewProxy(tb, "db.example") }, "NewProxy: the target must be host:port"},
		{"ProxyURL empty", func(tb testing.TB) { pgfencetest.ProxyURL(tb, "") }, "ProxyURL: the connection string is empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			msg := redacttest.Fatal(t, c.f)
			if !strings.Contains(msg, c.want) {
				t.Errorf("%s: the test fails with %q, want %q", c.name, msg, c.want)
			}
		})
	}
}
