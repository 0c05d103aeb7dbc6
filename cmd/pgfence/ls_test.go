package main

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

func TestLeasesLsAndRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	lc, err := leases.New(pool, leases.WithOwner("ls-test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	held, err := lc.TryAcquire(ctx, "reports/daily", 6*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := lc.TryAcquire(ctx, "reports/gone", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.ForceRelease(ctx, "reports/gone"); err != nil {
		t.Fatal(err)
	}

	r := db(t, url, "leases", "ls", "--json")
	if r.code != 0 {
		t.Fatalf("leases ls --json: exit %d", r.code)
	}
	var rows []leaseRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("leases ls --json is not a JSON array of leases: %v", err)
	}
	byName := map[string]leaseRow{}
	for _, row := range rows {
		byName[row.Name] = row
	}
	d, ok := byName["reports/daily"]
	switch {
	case !ok:
		t.Fatalf("reports/daily missing from %s", r.stdout)
	case d.Owner != held.Owner() || d.Fence != held.Fence():
		t.Errorf("reports/daily: owner %q fence %d, want %q %d", d.Owner, d.Fence, held.Owner(), held.Fence())
	case d.Expired || d.ExpiresInSeconds <= 0 || d.ExpiresInSeconds > 6:
		t.Errorf("reports/daily: expired %v, expires in %vs; want held, expiring within its 6s TTL", d.Expired, d.ExpiresInSeconds)
	case d.HeldForSeconds == nil || *d.HeldForSeconds < 0 || *d.HeldForSeconds > 60:
		t.Errorf("reports/daily: held for %v, want a small non-negative number of seconds", d.HeldForSeconds)
	}
	if g, ok := byName["reports/gone"]; ok && (!g.Expired || g.HeldForSeconds != nil || g.ExpiresInSeconds > 0) {
		t.Errorf("force-released reports/gone listed as %+v, want expired without held_for", g)
	}

	r = db(t, url, "leases", "ls")
	if r.code != 0 {
		t.Fatalf("leases ls: exit %d", r.code)
	}
	for _, want := range []string{"NAME", "OWNER", "FENCE", "EXPIRES", "HELD FOR", "reports/daily", held.Owner(), strconv.FormatInt(held.Fence(), 10), " in "} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("leases ls does not show %q:\n%s", want, r.stdout)
		}
	}

	// Break-glass: the holder loses the lease at its next renewal.
	r = db(t, url, "leases", "release", "--force", "reports/daily")
	if r.code != 0 || !strings.Contains(r.stdout, held.Owner()) {
		t.Fatalf("release --force: exit %d, stdout %q; want 0 and the former holder named", r.code, r.stdout)
	}
	select {
	case <-held.Done():
		if !errors.Is(held.Err(), leases.ErrLost) {
			t.Errorf("holder's lease ended with %v, want ErrLost", held.Err())
		}
	case <-time.After(30 * time.Second): // renewals every TTL/3 = 2s
		t.Fatal("holder did not lose the force-released lease")
	}
	_ = gone

	r = db(t, url, "leases", "release", "--force", "reports/never")
	if r.code != exitFailure || !strings.Contains(r.stderr, `lease "reports/never" is not held`) {
		t.Errorf("release of an unknown lease: exit %d, stderr %q; want 1 and a clear message", r.code, r.stderr)
	}
}

// `leases ls` lists every row of pgfence.leases, as its --help and
// docs/operators.md ("Inspecting") say: a released lease's row stays, shown
// as "expired ... ago" with no HELD FOR, and in --json with expired true,
// a negative expires_in_seconds and no held_for_seconds.
func TestLeasesLsListsExpiredRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	lc, err := leases.New(pool, leases.WithOwner("ls-expired"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	l, err := lc.TryAcquire(ctx, "reports/gone", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	r := db(t, url, "leases", "ls", "--json")
	if r.code != 0 {
		t.Fatalf("leases ls --json: exit %d", r.code)
	}
	var rows []leaseRow
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("leases ls --json is not a JSON array of leases: %v", err)
	}
	i := slices.IndexFunc(rows, func(row leaseRow) bool { return row.Name == "reports/gone" })
	switch {
	case i < 0:
		t.Errorf("leases ls --json omits the released lease reports/gone: %s", r.stdout)
	case rows[i].Owner != l.Owner() || rows[i].Fence != l.Fence():
		t.Errorf("reports/gone: owner %q fence %d, want its last grant's %q %d", rows[i].Owner, rows[i].Fence, l.Owner(), l.Fence())
	case !rows[i].Expired || rows[i].ExpiresInSeconds >= 0 || rows[i].HeldForSeconds != nil:
		t.Errorf("released reports/gone listed as %+v, want expired, negative expires_in_seconds, no held_for_seconds", rows[i])
	}

	r = db(t, url, "leases", "ls")
	if r.code != 0 {
		t.Fatalf("leases ls: exit %d", r.code)
	}
	row := regexp.MustCompile(`(?m)^reports/gone +` + regexp.QuoteMeta(l.Owner()) + ` +` + strconv.FormatInt(l.Fence(), 10) + ` +expired \S+ ago +- +-$`)
	if !row.MatchString(r.stdout) {
		t.Errorf("leases ls does not show reports/gone as `reports/gone OWNER FENCE expired ... ago - -`:\n%s", r.stdout)
	}
}

func TestLocksLsAndKey(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	env := cliEnv("DATABASE_URL=" + url)
	key := pglock.Key("ops/reindex")

	r := cli(t, env, "locks", "key", "ops/reindex")
	if r.code != 0 || !strings.HasPrefix(r.stdout, strconv.FormatInt(key, 10)+"\n") || !strings.Contains(r.stdout, "pgfence.lock_key('ops/reindex')") {
		t.Fatalf("locks key: exit %d, stdout %q", r.code, r.stdout)
	}

	holder := startCLI(t, env, "run", "--lock", "ops/reindex", "--", "sh", "-c", `echo "$PGFENCE_LOCK $PGFENCE_LOCK_KEY"; cat >/dev/null`)
	if l := holder.line(); l != "ops/reindex "+strconv.FormatInt(key, 10) {
		t.Fatalf("child printed %q, want PGFENCE_LOCK and PGFENCE_LOCK_KEY", l)
	}
	r = cli(t, env, "run", "--lock", "ops/reindex", "--no-wait", "--", "true")
	if r.code != exitHeld || !strings.Contains(r.stderr, "held by pid ") || !strings.Contains(r.stderr, `application "pgfence run"`) {
		t.Errorf("--no-wait on a held lock: exit %d, stderr %q; want 75 naming the holder's session", r.code, r.stderr)
	}
	waiter := startCLI(t, env, "run", "--lock", "ops/reindex", "--", "echo", "waiter ran")

	// Poll the listing until the waiter shows up (it connects first).
	var locks []lockRow
	deadline := time.Now().Add(cliTimeout)
	for {
		r = cli(t, env, "locks", "ls", "--json")
		if r.code != 0 {
			t.Fatalf("locks ls --json: exit %d", r.code)
		}
		locks = nil
		if err := json.Unmarshal([]byte(r.stdout), &locks); err != nil {
			t.Fatalf("locks ls --json is not a JSON array of locks: %v", err)
		}
		if len(locks) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling an external condition
	}
	if len(locks) != 2 {
		t.Fatalf("want a holder and a waiter, got %+v", locks)
	}
	g, w := locks[0], locks[1]
	if g.Key != key || !g.Granted || g.Mode != "ExclusiveLock" || g.SinceSource != "state_change" || g.ApplicationName != "pgfence run" || g.PID == 0 {
		t.Errorf("holder row %+v", g)
	}
	if g.BackendStart == nil || g.Since == nil || g.BackendStart.After(*g.Since) {
		t.Errorf("holder's session start %v is not before its since %v", g.BackendStart, g.Since)
	}
	if w.Key != key || w.Granted || w.SinceSource != "waitstart" || w.Since == nil || w.PID == g.PID {
		t.Errorf("waiter row %+v", w)
	}
	if !strings.Contains(r.stdout, `"key": "`+strconv.FormatInt(key, 10)+`"`) {
		t.Errorf("JSON key is not the decimal string of the 64-bit key: %s", r.stdout)
	}

	r = cli(t, env, "locks", "ls")
	for _, want := range []string{"KEY", "STATE", strconv.FormatInt(key, 10), "granted", "waiting", "(waitstart)", "(state_change)", "pgfence run"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("locks ls does not show %q:\n%s", want, r.stdout)
		}
	}

	_ = holder.stdin.Close()
	if code := holder.wait(); code != 0 {
		t.Fatalf("holder: exit %d", code)
	}
	if l := waiter.line(); l != "waiter ran" {
		t.Fatalf("waiter printed %q", l)
	}
	if code := waiter.wait(); code != 0 {
		t.Fatalf("waiter: exit %d", code)
	}
	if r = cli(t, env, "locks", "ls"); !strings.Contains(r.stdout, "no advisory locks") {
		t.Errorf("after both runs, locks ls shows:\n%s", r.stdout)
	}
}

// A role that may take leases (pgfence_client, or plain SQL) chooses lease
// names, owners and data: 1..200 bytes of UTF-8, control characters
// included. Printed as they were, a newline and tabs forged a row of
// `leases ls` ("prod/leader held by node-7") and an escape sequence hid
// the real one or retitled the operator's terminal. Every text output that
// shows them quotes such a value instead; JSON escapes it anyway.
func TestHostileNamesCannotForgeOutput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	const (
		name  = "billing\nprod/leader\tnode-7\t1\tin 59s\t1s\t-\x1b[8m"
		owner = "pod-x\x1b]0;pwned\a"
		data  = `{"addr": "10.0.0.7` + "\u202e" + `"}` // a right-to-left override: valid JSON, unescaped by jsonb
	)
	if _, err := pool.Exec(ctx, `SELECT pgfence.try_acquire($1, $2, 600000000, $3)`, name, owner, data); err != nil {
		t.Fatal(err)
	}
	clean := func(what, out string) {
		t.Helper()
		for _, r := range out {
			if r != '\n' && !printable(string(r)) {
				t.Errorf("%s printed %q (in %q)", what, r, out)
				return
			}
		}
		if strings.Contains(out, "\nprod/leader") {
			t.Errorf("%s printed a forged line: %q", what, out)
		}
	}
	r := db(t, url, "leases", "ls")
	clean("leases ls", r.stdout)
	if r.code != exitOK || !strings.Contains(r.stdout, strconv.Quote(name)) || !strings.Contains(r.stdout, strconv.Quote(owner)) {
		t.Errorf("leases ls: exit %d, stdout %q; want the name and owner quoted", r.code, r.stdout)
	}
	r = db(t, url, "check", "--max-hold", "1us")
	clean("check", r.stdout)
	r = db(t, url, "run", "--lease", name, "--ttl", "30s", "--no-wait", "--", "true")
	clean("run --no-wait (stderr)", r.stderr)
	if r.code != exitHeld || !strings.Contains(r.stderr, strconv.Quote(owner)) {
		t.Errorf("run --no-wait: exit %d, stderr %q; want %d naming the quoted owner", r.code, r.stderr, exitHeld)
	}
	r = db(t, url, "leases", "release", "--force", name)
	clean("leases release --force", r.stdout+r.stderr)
	if r.code != exitOK {
		t.Errorf("leases release --force: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestDisplay(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"billing/nightly-report": "billing/nightly-report",
		"café report":            "café report",
		"":                       "",
		"a\nb":                   `"a\nb"`,
		"a\tb":                   `"a\tb"`,
		"\x1b[2J":                `"\x1b[2J"`,
		"x\u202ey":               `"x\u202ey"`,
		"a\u00a0b":               `"a\u00a0b"`, // a no-break space looks like a space
		`"quoted"`:               `"\"quoted\""`,
		"bad \xff byte":          `"bad \xff byte"`,
	} {
		if got := display(in); got != want {
			t.Errorf("display(%q) = %s, want %s", in, got, want)
		}
	}
}
