// Package redacttest is the table of connection strings whose passwords
// must never show in an error or log line: URL and keyword/value forms,
// well-formed and malformed, with passwords holding spaces, backslashes,
// quotes and percent-escapes. Tests of every component that takes a
// connection string run it.
package redacttest

import (
	"fmt"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A Case is a connection string and the passwords it holds (as written,
// and as the parsers may decode them).
type Case struct {
	Name      string
	DSN       string
	Passwords []string
}

// Cases returns the table for a server at host:port (use one where nothing
// listens, or one that refuses the user) and database db.
func Cases(host, port, db string) []Case {
	hp := host + ":" + port
	kv := "host=" + host + " port=" + port + " dbname=" + db + " user=pgfence_nobody connect_timeout=5 sslmode=disable "
	q := "?connect_timeout=5&sslmode=disable"
	enc := url.UserPassword("pgfence_nobody", `Zq9 b\k'Y"%41vW`).String()
	return []Case{
		{"url escaped", "postgres://" + enc + "@" + hp + "/" + db + q, []string{`Zq9 b\k'Y"%41vW`}},
		{"url raw space quote backslash", "postgres://pgfence_nobody:Zq9 b\\k'Y\"vW@" + hp + "/" + db + q, []string{`Zq9 b\k'Y"vW`}},
		{"url percent escape", "postgres://pgfence_nobody:Xj%41Kw%25Rv@" + hp + "/" + db + q, []string{"Xj%41Kw%25Rv", "XjAKw%Rv"}},
		{"url bad percent escape", "postgres://pgfence_nobody:Hm%zzQv7@" + hp + "/" + db + q, []string{"Hm%zzQv7"}},
		{"url unescaped at", "postgres://pgfence_nobody:Gk7@Wq3z@" + hp + "/" + db + q, []string{"Gk7@Wq3z"}},
		// The user part is read as a host here: "localhost" keeps the
		// lookup off the network.
		{"url unescaped slash", "postgres://localhost:8675/Vbq4Ty@" + hp + "/" + db + q, []string{"8675/Vbq4Ty"}},
		{"url unescaped colon and hash", "postgres://pgfence_nobody:Tn:4#Pq8x@" + hp + "/" + db + q, []string{"Tn:4#Pq8x"}},
		{"url query password", "postgres://pgfence_nobody@" + hp + "/" + db + q + "&password=Rw%20Lk9%27Zv", []string{"Rw%20Lk9%27Zv", "Rw Lk9'Zv"}},
		// pgx percent-decodes query keys.
		{"url encoded key", "postgres://pgfence_nobody@" + hp + "/" + db + q + "&pass%77ord=Yk%21Tw9", []string{"Yk%21Tw9", "Yk!Tw9"}},
		{"kv quoted", kv + `password='Fh2 \\Jq\'Xz%41'`, []string{`Fh2 \Jq'Xz%41`, `Fh2 \\Jq\'Xz%41`}},
		{"kv quoted quotes", kv + `password='Hv7\'Qm"Zp'`, []string{`Hv7'Qm"Zp`, `Hv7\'Qm"Zp`}},
		{"kv unquoted", kv + `password=Wq8\Lp%zzVn`, []string{`Wq8\Lp%zzVn`}},
		{"kv unquoted space", kv + `password=Kd4 Yv8Qm`, []string{"Kd4 Yv8Qm"}},
		{"kv broken quote", kv + `password='Mv3 Tz9Qk`, []string{"Mv3 Tz9Qk"}},
		{"kv password first", `password='Bq5 Nx\'Wr' ` + kv, []string{`Bq5 Nx'Wr`}},
	}
}

// Targets returns the table twice: for an address where nothing listens,
// and for the server of serverURL (in its database), which refuses the
// table's user.
func Targets(t testing.TB, serverURL string) map[string][]Case {
	t.Helper()
	cfg, err := pgx.ParseConfig(serverURL)
	if err != nil {
		t.Fatalf("redacttest: parse the server URL: %v", err)
	}
	return map[string][]Case{
		"unreachable":     Cases("127.0.0.1", "1", "nowhere"),
		"refusing server": Cases(cfg.Host, strconv.Itoa(int(cfg.Port)), cfg.Database),
	}
}

// Leak returns the first piece of 3 or more bytes of one of passwords that
// text contains, or "" if none.
func Leak(text string, passwords []string) string {
	for _, pw := range passwords {
		for i := 0; i+3 <= len(pw); i++ {
			if strings.Contains(text, pw[i:i+3]) {
				return pw[i : i+3]
			}
		}
	}
	return ""
}

// Fatal runs f with a testing.TB that is t but for Fatalf, which records
// the message and ends f's goroutine, as testing.T's does, without failing
// t. It returns the message, or "" if f did not call Fatalf: for helpers
// that report a bad connection string through t.
func Fatal(t testing.TB, f func(testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msg
}

type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
