// Package redact keeps passwords out of error and log text. pgfence's
// commands and libraries take connection strings (URL or keyword/value
// form) and report errors about them; the drivers' own messages may echo
// parts of the string, and a string that does not parse as its author
// meant (an unescaped '@', '/' or quote in a password) puts pieces of the
// password where a host, port or database name is expected, which the
// messages then show. Redacting what the password could be, however the
// string parses, is the only safe answer.
package redact

import (
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// Mask replaces what is redacted.
const Mask = "xxxxx"

// minPart is the shortest piece of a secret that is redacted where it
// appears: shorter pieces occur in ordinary text by chance.
const minPart = 3

// Secrets returns what the password of connString could be: the password
// as pgx parses it, the userinfo password of a URL up to the last '@' of
// the string (raw and percent-decoded), the value of every URL query key
// that decodes to password or sslpassword, the value after every password=
// (quoted or not), and PGPASSWORD; each also as Go quotes it (%q).
// Secrets shorter than 3 bytes are left out.
func Secrets(connString string) []string {
	var out []string
	add := func(s string) {
		if len(s) < minPart {
			return
		}
		out = append(out, s)
		// As Go quotes it (%q, %+q): net/url's errors quote the URL.
		for _, q := range []string{strconv.Quote(s), strconv.QuoteToASCII(s)} {
			if q = q[1 : len(q)-1]; q != s {
				out = append(out, q)
			}
		}
	}
	if cfg, err := pgconn.ParseConfig(connString); err == nil {
		add(cfg.Password)
	}
	add(os.Getenv("PGPASSWORD"))
	if rest, ok := cutScheme(connString); ok {
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok {
				add(pw)
				if dec, err := url.PathUnescape(pw); err == nil {
					add(dec)
				}
			}
		}
		// Query keys are percent-decoded by pgx: pass%77ord=.
		if _, query, ok := strings.Cut(rest, "?"); ok {
			query, _, _ = strings.Cut(query, "#")
			for _, kv := range strings.Split(query, "&") {
				k, v, ok := strings.Cut(kv, "=")
				if dk, err := url.QueryUnescape(k); ok && err == nil && strings.HasSuffix(strings.ToLower(dk), "password") {
					add(v)
					if dec, err := url.QueryUnescape(v); err == nil {
						add(dec)
					}
				}
			}
		}
	}
	for s := connString; ; {
		i := strings.Index(strings.ToLower(s), "password=")
		if i < 0 {
			break
		}
		s = s[i+len("password="):]
		v, raw := valueOf(s) // keyword/value value, unescaped and as written
		add(v)
		add(raw)
		if j := strings.IndexAny(s, "&#"); j >= 0 { // URL query value
			add(s[:j])
			if dec, err := url.QueryUnescape(s[:j]); err == nil {
				add(dec)
			}
		}
	}
	return out
}

func cutScheme(s string) (string, bool) {
	for _, p := range []string{"postgres://", "postgresql://"} {
		if len(s) >= len(p) && strings.EqualFold(s[:len(p)], p) {
			return s[len(p):], true
		}
	}
	return "", false
}

// nextKeyword finds the next " keyword=" of a keyword/value string.
var nextKeyword = regexp.MustCompile(`\s+[^\s=']+\s*=`)

// valueOf reads a keyword/value value at the start of s: quoted with
// backslash escapes, or up to the next keyword (not the next space: an
// unquoted password with a space is meant whole, even though it does not
// parse). It returns the value and, for a quoted one, its text between the
// quotes as written (escapes kept).
func valueOf(s string) (value, raw string) {
	if !strings.HasPrefix(s, "'") {
		if loc := nextKeyword.FindStringIndex(s); loc != nil {
			return strings.TrimSpace(s[:loc[0]]), ""
		}
		return strings.TrimSpace(s), ""
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		case c == '\'':
			return b.String(), s[1:i]
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), s[1:]
}

// String returns s with every piece of a secret at least 3 bytes long
// replaced by Mask.
func String(s string, secrets []string) string {
	if len(secrets) == 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		n := longestPiece(s[i:], secrets)
		if n == 0 {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteString(Mask)
		i += n
	}
	return b.String()
}

// longestPiece returns the length of the longest prefix of s that is a
// piece of a secret at least minPart long, or 0.
func longestPiece(s string, secrets []string) int {
	best := 0
	for _, sec := range secrets {
		n := 0
		for n < len(s) && n < len(sec) && strings.Contains(sec, s[:n+1]) {
			n++
		}
		if n >= minPart {
			best = max(best, n)
		}
	}
	return best
}

// Error returns err with its text redacted (String), or err itself when
// there is nothing to redact or err is nil. The result still wraps err
// for errors.Is and errors.As.
func Error(err error, secrets []string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if red := String(msg, secrets); red != msg {
		return &redacted{msg: red, err: err}
	}
	return err
}

// ErrorFor is Error with the secrets of connString: for an error about
// the one connection string it came from.
func ErrorFor(err error, connString string) error {
	return Error(err, Secrets(connString))
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
