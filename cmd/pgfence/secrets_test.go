package main

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/redact/redacttest"
)

// No line the command prints shows any piece of the password, for every
// shape of connection string, given by flag or by DATABASE_URL, to an
// unreachable address or to a server that refuses the user.
func TestOutputHidesThePassword(t *testing.T) {
	t.Parallel()
	targets := redacttest.Targets(t, pgtest.EmptyURL(t))
	for target, cases := range targets {
		for _, c := range cases {
			t.Run(target+"/"+c.Name, func(t *testing.T) {
				t.Parallel()
				runs := []result{
					cli(t, cliEnv(), "--database-url", c.DSN, "locks", "ls"),
					cli(t, cliEnv("DATABASE_URL="+c.DSN), "migrate", "up"),
				}
				for _, r := range runs {
					if r.code == 0 {
						t.Errorf("succeeded: %+v", r)
					}
					if leak := redacttest.Leak(r.stdout+r.stderr, c.Passwords); leak != "" {
						t.Errorf("output shows %q of the password:\n%s%s", leak, r.stdout, r.stderr)
					}
				}
			})
		}
	}
}
