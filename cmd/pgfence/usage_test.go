package main

import (
	"context"
	"strings"
	"testing"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/redact/redacttest"
	"github.com/pgfence/pgfence/pglock"
)

// Bad input exits 2 with a message naming the problem, before connecting:
// the database URL points nowhere, and a command that connected would exit
// 69 instead.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"unknown command", []string{"bogus"}, `unknown command "bogus"`},
		{"unknown flag", []string{"leases", "ls", "--bogus"}, "unknown flag: --bogus"},
		{"unknown run flag", []string{"run", "--bogus", "--", "true"}, "unknown flag: --bogus"},
		{"missing ttl", []string{"run", "--lease", "job", "--", "true"}, "--lease needs --ttl"},
		{"ttl too short", []string{"run", "--lease", "job", "--ttl", "500ms", "--", "true"}, "--ttl must be at least 1s, got 500ms"},
		{"ttl too long", []string{"run", "--lease", "job", "--ttl", "100000h", "--", "true"}, "--ttl must be at most 24h0m0s, got 100000h0m0s"},
		{"bad ttl", []string{"run", "--lease", "job", "--ttl", "soon", "--", "true"}, `invalid argument "soon"`},
		{"ttl with lock", []string{"run", "--lock", "job", "--ttl", "5s", "--", "true"}, "--ttl applies to --lease only"},
		{"lease and lock", []string{"run", "--lease", "a", "--lock", "b", "--ttl", "5s", "--", "true"}, "not both"},
		{"neither", []string{"run", "--", "true"}, "run needs --lease NAME"},
		{"no command", []string{"run", "--lease", "job", "--ttl", "5s"}, "run needs a command"},
		{"negative grace", []string{"run", "--lease", "job", "--ttl", "5s", "--grace", "-1s", "--", "true"}, "--grace must not be negative"},
		{"long lease name", []string{"run", "--lease", strings.Repeat("x", 201), "--ttl", "5s", "--", "true"}, "lease name must be 1..200 bytes, got 201"},
		{"lease name not UTF-8", []string{"run", "--lease", "job\xff", "--ttl", "5s", "--", "true"}, "lease name must be valid UTF-8"},
		{"release name not UTF-8", []string{"leases", "release", "--force", "\xff"}, "lease name must be valid UTF-8"},
		{"long lock name", []string{"run", "--lock", strings.Repeat("x", 201), "--", "true"}, "lock name must be 1..200 bytes, got 201"},
		{"lock name not UTF-8", []string{"run", "--lock", "job\xff", "--", "true"}, "lock name must be valid UTF-8"},
		{"once key not UTF-8", []string{"run", "--lease", "job", "--ttl", "5s", "--once", "\xff", "--", "true"}, "--once key must be valid UTF-8"},
		// An empty value (an unset variable: --once "$PERIOD") is a
		// mistake, not the flag left out: --once "" would run every time.
		{"empty once key", []string{"run", "--lease", "job", "--ttl", "5s", "--once", "", "--", "true"}, "--once key must be 1..200 bytes, got 0"},
		{"empty lease with lock", []string{"run", "--lease", "", "--lock", "job", "--", "true"}, "--lease must not be empty"},
		{"empty lock with lease", []string{"run", "--lease", "job", "--lock", "", "--ttl", "5s", "--", "true"}, "--lock must not be empty"},
		{"release without force", []string{"leases", "release", "job"}, "add --force"},
		{"release without name", []string{"leases", "release", "--force"}, "accepts 1 arg"},
		{"locks key without name", []string{"locks", "key"}, "accepts 1 arg"},
		{"migrate without subcommand", []string{"migrate"}, "up, down, version or force"},
		{"migrate sideways", []string{"migrate", "sideways"}, `unknown migrate subcommand "sideways"`},
		{"migrate force without version", []string{"migrate", "force"}, "accepts 1 arg"},
		{"migrate force not a number", []string{"migrate", "force", "v4"}, `want a version number (0 for none), got "v4"`},
		{"migrate force unknown version", []string{"migrate", "force", "1000"}, "version 1000 is not one of pgfence's migrations"},
		{"demo one worker", []string{"demo", "--workers", "1"}, "--workers must be between 2 and 50"},
		{"demo no periods", []string{"demo", "--periods", "0"}, "--periods must be between 1 and 1000"},
		// The frozen worker stays frozen for --ttl, each period takes
		// --work: the demo must fit in its own time limit.
		{"demo ttl too long", []string{"demo", "--ttl", "1h"}, "--ttl must be between 1s and 1m0s, got 1h0m0s"},
		{"demo work too long", []string{"demo", "--work", "1h"}, "--work must be between 0s and 10s, got 1h0m0s"},
		{"demo too long in all", []string{"demo", "--periods", "1000", "--work", "1s"}, "would take at least 16m43s; the demo gives up after 5m0s"},
		{"demo worker ttl too long", []string{"demo", "worker", "--ttl", "1h"}, "--ttl must be between 1s and 1m0s, got 1h0m0s"},
		{"demo worker work too long", []string{"demo", "worker", "--work", "11s"}, "--work must be between 0s and 10s, got 11s"},
		{"demo worker period out of range", []string{"demo", "worker", "--first", "2147483647", "--periods", "2"}, "--first + --periods at most 2147483647"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), tc.args...)
			if r.code != exitUsage {
				t.Errorf("exit %d, want %d", r.code, exitUsage)
			}
			if !strings.Contains(r.stderr, tc.want) {
				t.Errorf("stderr %q does not say %q", r.stderr, tc.want)
			}
			if !strings.Contains(r.stderr, "--help' for usage") {
				t.Errorf("stderr %q does not point to --help", r.stderr)
			}
		})
	}
}

// `locks key` refuses a name pglock would refuse (empty, over 200 bytes,
// not UTF-8) as `run --lock` does: exit 2 and the rule on stderr, and no
// key on stdout for a lock nobody can take.
func TestLocksKeyRefusesBadNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, want string }{
		{"", "lock name must be 1..200 bytes, got 0"},
		{strings.Repeat("x", 201), "lock name must be 1..200 bytes, got 201"},
		{"bad\xff", "lock name must be valid UTF-8"},
	} {
		r := cli(t, cliEnv(), "locks", "key", tc.name)
		if r.code != exitUsage || r.stdout != "" {
			t.Errorf("locks key %q: exit %d, stdout %q; want %d and nothing", tc.name, r.code, r.stdout, exitUsage)
		}
		if !strings.Contains(r.stderr, tc.want) {
			t.Errorf("locks key %q: stderr %q does not say %q", tc.name, r.stderr, tc.want)
		}
	}
}

// A command run under `pgfence run` that exits 2 (grep, diff and many
// tools say "trouble" so) is passed on as 2 with nothing on stderr: no
// "Run 'pgfence run --help' for usage." blaming a command line that was
// fine, neither from pgfence nor from its reaper. The hint is for
// pgfence's own usage errors (TestUsageErrors).
func TestRunCommandExit2IsNotAUsageError(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, args := range [][]string{
		{"run", "--lease", "two", "--ttl", "5s", "--", "sh", "-c", "exit 2"},
		{"run", "--lock", "two", "--", "sh", "-c", "exit 2"},
	} {
		r := db(t, url, args...)
		if r.code != 2 {
			t.Errorf("%v: exit %d, want the command's 2", args, r.code)
		}
		if r.stderr != "" {
			t.Errorf("%v: the command printed nothing, yet stderr is %q", args, r.stderr)
		}
	}
}

func TestHelpDocumentsExitCodes(t *testing.T) {
	t.Parallel()
	r := cli(t, cliEnv(), "--help")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, want := range []string{"Exit codes:", "75", "69", "128+N", "DATABASE_URL"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--help does not mention %q", want)
		}
	}
}

func TestUnreachableDatabase(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"leases", "ls"}, {"locks", "ls"}, {"migrate", "version"}, {"run", "--lease", "job", "--ttl", "5s", "--", "true"}} {
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), args...)
		if r.code != exitUnavailable {
			t.Errorf("%v: exit %d, want %d", args, r.code, exitUnavailable)
		}
		if !strings.Contains(r.stderr, "127.0.0.1:1") || !strings.Contains(r.stderr, "unreachable") {
			t.Errorf("%v: stderr %q does not name the address and say it is unreachable", args, r.stderr)
		}
	}
}

// With no URL at all, pgx reads libpq's PG* variables.
func TestPGEnvironment(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	r := cli(t, cliEnv("PGHOST="+cfg.Host, "PGPORT="+itoa(int(cfg.Port)), "PGDATABASE="+cfg.Database,
		"PGUSER="+cfg.User, "PGPASSWORD="+cfg.Password, "PGSSLMODE=disable"), "leases", "ls")
	if r.code != 0 || !strings.Contains(r.stdout, "no leases") {
		t.Fatalf("leases ls over PG* variables: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestNotMigrated(t *testing.T) {
	t.Parallel()
	url := pgtest.EmptyURL(t)
	for _, args := range [][]string{{"leases", "ls"}, {"run", "--lease", "job", "--ttl", "5s", "--", "true"}, {"demo", "--workers", "2", "--periods", "1"}} {
		r := db(t, url, args...)
		if r.code != exitFailure || !strings.Contains(r.stderr, "run `pgfence migrate up`") {
			t.Errorf("%v on an unmigrated database: exit %d, stderr %q; want exit 1 and the migrate hint", args, r.code, r.stderr)
		}
	}
	// Nothing was created.
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgfence%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d pgfence schemas created in an unmigrated database", n)
	}
}

// `locks key` prints a name the terminal would act on (an escape
// sequence, a newline, an invisible character) as an escaped literal, and
// the psql it prints still computes the name's key: pasted into psql, it
// takes the very lock pglock takes, whatever standard_conforming_strings
// says.
func TestLocksKeyEscapesUnprintableNames(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	for _, name := range []string{
		"ops/reindex",
		"it's",
		`back\slash`,
		"\x1b[2Jcleared",
		"two\nlines",
		"tab\there",
		"zero\u200bwidth",
		"bell\a and 'quote' and \\",
	} {
		r := cli(t, cliEnv(), "locks", "key", name)
		if r.code != 0 {
			t.Fatalf("locks key %q: exit %d, stderr %q", name, r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 3 {
			t.Errorf("locks key %q printed %d lines, want 3:\n%s", name, len(lines), r.stdout)
			continue
		}
		if i := strings.IndexFunc(r.stdout, func(c rune) bool { return c != '\n' && !unicode.IsPrint(c) }); i >= 0 {
			t.Errorf("locks key %q printed the unprintable %q:\n%q", name, []rune(r.stdout[i:])[0], r.stdout)
		}
		expr, ok := strings.CutPrefix(lines[1], "psql: SELECT ")
		expr, _, found := strings.Cut(expr, ";  --")
		if !ok || !found {
			t.Errorf("locks key %q: second line %q is not the lock_key query", name, lines[1])
			continue
		}
		// Also in a psql whose role sets standard_conforming_strings off,
		// where a backslash in '...' is an escape.
		for _, scs := range []string{"on", "off"} {
			if _, err := conn.Exec(ctx, "SET standard_conforming_strings = "+scs); err != nil {
				t.Fatal(err)
			}
			var key int64
			// Parsed anew (exec mode): a cached prepared statement keeps
			// the parse of its first run.
			if err := conn.QueryRow(ctx, "SELECT "+expr, pgx.QueryExecModeExec).Scan(&key); err != nil {
				t.Errorf("locks key %q: its psql %q fails (standard_conforming_strings %s): %v", name, expr, scs, err)
			} else if key != pglock.Key(name) {
				t.Errorf("locks key %q: its psql %q computes %d with standard_conforming_strings %s, want %d",
					name, expr, key, scs, pglock.Key(name))
			}
		}
	}
}

// A connection string that pgx cannot use says why (the TLS key file is
// missing, the port is not a number), without the password: exit 2
// before connecting.
func TestInvalidConnectionStringSaysWhy(t *testing.T) {
	t.Parallel()
	const pw = "Qx7Secret9"
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:" + pw + "@127.0.0.1:1/x?sslmode=require&sslkey=/nonexistent/key.pem&sslcert=/nonexistent/cert.pem", "/nonexistent/"},
		{"host=127.0.0.1 port=notaport user=u password=" + pw, "invalid port"},
		{"host=127.0.0.1 user=u password=" + pw + " connect_timeout=soon", "invalid connect_timeout"},
	} {
		r := cli(t, cliEnv("DATABASE_URL="+tc.dsn), "leases", "ls")
		if r.code != exitUsage || !strings.Contains(r.stderr, "invalid connection string") || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d saying %q", tc.dsn, r.code, r.stderr, exitUsage, tc.want)
		}
		if leak := redacttest.Leak(r.stderr, []string{pw}); leak != "" {
			t.Errorf("%s: stderr %q shows %q of the password", tc.dsn, r.stderr, leak)
		}
	}
}
