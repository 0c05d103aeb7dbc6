package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A lease name in a command that an error suggests is quoted for the
// shell: the suggestion, pasted, names that lease (not another, not a
// flag), and a name with control characters does not reach the terminal
// raw (an escape sequence, a line break that forges a new line).
func TestSuggestedCommandQuotesTheName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := "job $(id) 'a'\n\x1b[31m;-x"
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.try_acquire($1, 'pod-1', 600000000, NULL)`, name); err != nil {
		t.Fatal(err)
	}
	r := db(t, url, "leases", "handover", "--timeout", "10ms", name)
	if r.code != exitFailure {
		t.Fatalf("handover of a holder that ignores it: exit %d, stderr %q; want 1", r.code, r.stderr)
	}
	if msg := strings.TrimSuffix(r.stderr, "\n"); strings.ContainsAny(msg, "\n\x1b") {
		t.Errorf("stderr has a raw control character: %q", r.stderr)
	}
	_, cmd, ok := strings.Cut(r.stderr, "pgfence leases release --force ")
	if !ok {
		t.Fatalf("stderr %q suggests no release", r.stderr)
	}
	cmd = strings.TrimSuffix(strings.TrimSpace(cmd), ")")
	out, err := exec.Command("bash", "-c", "printf '%s\\0' "+cmd).Output()
	if got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00"); err != nil || len(got) != 1 && !(len(got) == 2 && got[0] == "--") {
		t.Errorf("the suggestion %q is not one argument (optionally after --): %q, %v", cmd, out, err)
	} else if got[len(got)-1] != name {
		t.Errorf("the suggestion %q names %q, want %q", cmd, got[len(got)-1], name)
	}
}

// shellArg's word is the name, whatever the name, as bash reads it.
func TestShellArgRoundTrips(t *testing.T) {
	t.Parallel()
	for _, name := range []string{
		"billing/nightly", "a b", "it's", `back\slash`, "#comment", "~root", "-rf", "--force",
		"$HOME", "`id`", "tab\there", "nl\nhere", "esc\x1b[0m", "naïve ✓", "\u202eevil", "\uFFFD", "a=b,c%d@e:f+g",
	} {
		arg := shellArg(name)
		out, err := exec.Command("bash", "-c", "printf '%s\\0' "+arg).Output()
		got := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
		if err != nil || got[len(got)-1] != name || len(got) > 2 || len(got) == 2 && got[0] != "--" {
			t.Errorf("shellArg(%q) = %s, which bash reads as %q (%v)", name, arg, got, err)
		}
		if strings.ContainsFunc(arg, func(r rune) bool { return r < ' ' || r == 0x7f || r == '\u202e' }) {
			t.Errorf("shellArg(%q) = %q has a raw control character", name, arg)
		}
	}
}

// A command that cannot run is named readably: an empty name is shown as
// "", and a name with a line break or an escape sequence does not reach
// the terminal raw.
func TestCommandNotFoundNamesItReadably(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, tc := range []struct{ name, want string }{
		{"", `command not found: ""`},
		{"no\nsuch\x1b[31m", `command not found: "no\nsuch\x1b[31m"`},
		{"pgfence-no-such-command", "command not found: pgfence-no-such-command"},
	} {
		r := db(t, url, "run", "--lock", "notfound", "--", tc.name)
		if r.code != exitNotFound || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("run -- %q: exit %d, stderr %q; want %d saying %s", tc.name, r.code, r.stderr, exitNotFound, tc.want)
		}
	}
}
