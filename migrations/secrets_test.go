package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/redact/redacttest"
	"github.com/pgfence/pgfence/migrations"
)

// No error of Up, Down or Version shows any piece of the password, for
// every shape of connection string: unreachable, and refused by a real
// server. Before, a malformed string's parse error echoed it with only
// part of the password masked.
func TestErrorsHideThePassword(t *testing.T) {
	t.Parallel()
	targets := redacttest.Targets(t, pgtest.EmptyURL(t))
	for target, cases := range targets {
		for _, c := range cases {
			t.Run(target+"/"+c.Name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, _, verr := migrations.Version(ctx, c.DSN)
				for op, err := range map[string]error{
					"Up": migrations.Up(ctx, c.DSN), "Down": migrations.Down(ctx, c.DSN), "Version": verr,
				} {
					if err == nil {
						t.Errorf("%s succeeded", op)
						continue
					}
					if leak := redacttest.Leak(err.Error(), c.Passwords); leak != "" {
						t.Errorf("%s error %q shows %q of the password", op, err, leak)
					}
				}
			})
		}
	}
}
