package redact

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/redact/redacttest"
)

// Whatever the drivers say about a connection string, redacted, shows no
// piece of its password: here the worst they could say, the string itself.
func TestStringHidesEveryShape(t *testing.T) {
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		secrets := Secrets(c.DSN)
		msg := "cannot parse `" + c.DSN + "`: failed"
		if _, err := pgconn.ParseConfig(c.DSN); err != nil {
			msg += "; pgx: " + err.Error()
		}
		got := String(msg, secrets)
		if leak := redacttest.Leak(got, c.Passwords); leak != "" {
			t.Errorf("%s: %q leaks %q", c.Name, got, leak)
		}
		if !strings.Contains(got, "127.0.0.1") {
			t.Errorf("%s: %q hides the host too", c.Name, got)
		}
	}
}

func TestError(t *testing.T) {
	base := errors.New("connect to user:Sx7Kq9@host failed")
	err := Error(base, []string{"Sx7Kq9"})
	if err.Error() != "connect to user:xxxxx@host failed" || !errors.Is(err, base) {
		t.Errorf("Error = %q", err)
	}
	if Error(base, nil) != base || Error(nil, []string{"abc"}) != nil {
		t.Error("Error changed what needs no redaction")
	}
}
