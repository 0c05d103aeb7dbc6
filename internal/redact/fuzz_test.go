package redact

import (
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/redact/redacttest"
)

// dsnForms writes a connection string around password pw, one per way a
// user may pass it: URL userinfo escaped and raw, URL query escaped and
// raw, keyword/value quoted (as libpq escapes) and unquoted, a password
// given before the other keywords, a percent-encoded key (pgx decodes
// keys) and the client key's sslpassword.
var dsnForms = []func(pw string) string{
	func(pw string) string {
		return "postgres://" + url.UserPassword("pgfence_nobody", pw).String() + "@127.0.0.1:1/nowhere?sslmode=disable"
	},
	func(pw string) string {
		return "postgres://pgfence_nobody:" + pw + "@127.0.0.1:1/nowhere?sslmode=disable"
	},
	func(pw string) string {
		return "postgres://pgfence_nobody@127.0.0.1:1/nowhere?sslmode=disable&password=" + url.QueryEscape(pw)
	},
	func(pw string) string {
		return "postgres://pgfence_nobody@127.0.0.1:1/nowhere?sslmode=disable&password=" + pw
	},
	func(pw string) string {
		return "host=127.0.0.1 port=1 dbname=nowhere user=pgfence_nobody password=" + kvQuote(pw)
	},
	func(pw string) string {
		return "host=127.0.0.1 port=1 dbname=nowhere user=pgfence_nobody password=" + pw
	},
	func(pw string) string { return "password=" + kvQuote(pw) + " host=127.0.0.1 port=1 dbname=nowhere" },
	func(pw string) string {
		return "postgres://pgfence_nobody@127.0.0.1:1/nowhere?sslmode=disable&pass%77ord=" + url.QueryEscape(pw)
	},
	func(pw string) string {
		return "postgres://pgfence_nobody@127.0.0.1:1/nowhere?sslpassword=" + url.QueryEscape(pw) + "&sslmode=disable"
	},
}

// kvQuote quotes s as a keyword/value value.
func kvQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// FuzzStringHidesPassword looks for connection strings the table of
// redacttest lacks: whatever the password, in whichever form it is
// written, the worst a driver could say — the string itself and pgx's
// parse error, Go-quoted or not — shows no 3-byte piece of it once
// redacted, nor of what a parser may decode it to.
func FuzzStringHidesPassword(f *testing.F) {
	for _, c := range redacttest.Cases("127.0.0.1", "1", "nowhere") {
		for form := range dsnForms {
			f.Add(c.Passwords[0], uint8(form))
		}
	}
	f.Add("Q7\x00\x01\xffz\"\\", uint8(1))
	f.Fuzz(func(t *testing.T, pw string, form uint8) {
		if int(form) >= len(dsnForms) {
			t.Skip("no such form")
		}
		// The mask is made of x: a password holding an x could match the
		// mask or its edge, and read as a leak where none is.
		// An unquoted keyword/value password ends at a space that starts
		// the next keyword, so one with '=' or a quote is not one password.
		if len(pw) < minPart || strings.Contains(pw, "x") || strings.Contains(pw, "\x00") ||
			(form == 5 && (strings.ContainsAny(pw, "='") || strings.TrimSpace(pw) != pw)) ||
			(form == 3 && strings.ContainsAny(pw, "&#")) {
			t.Skip("not a password this form can carry")
		}
		dsn := dsnForms[form](pw)
		msg := "cannot parse `" + dsn + "`: failed; quoted " + strconv.Quote(dsn)
		if _, err := pgconn.ParseConfig(dsn); err != nil {
			msg += "; pgx: " + err.Error()
		}
		got := String(msg, Secrets(dsn))
		// No 3-byte piece of the password or of what a parser may decode
		// it to; and none of its written forms whole (their pieces, such
		// as "%2F", also occur in the rest of the string).
		pieces := []string{pw}
		for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
			if dec, err := unescape(pw); err == nil && dec != pw {
				pieces = append(pieces, dec)
			}
		}
		if leak := redacttest.Leak(got, pieces); leak != "" {
			t.Errorf("form %d, password %q: %q leaks %q", form, pw, got, leak)
		}
		q := strconv.Quote(pw)
		for _, written := range []string{url.QueryEscape(pw), url.PathEscape(pw), kvQuote(pw), q[1 : len(q)-1]} {
			if written != pw && strings.Contains(got, written) {
				t.Errorf("form %d, password %q: %q shows it written as %q", form, pw, got, written)
			}
		}
	})
}
