package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// fence bump raises the floor --gap above every fence and the clock, so
// the next lease's fence exceeds it; bad gaps are usage errors that connect
// nowhere, and a client role is told who may bump.
func TestFenceBump(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	floor := func() int64 {
		t.Helper()
		var v int64
		if err := conn.QueryRow(ctx, `SELECT floor FROM pgfence.fence_floor`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	grantFence := func(name string) int64 {
		t.Helper()
		var f int64
		if err := conn.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire($1, 'test', 60000000) WHERE granted`, name).Scan(&f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	before := grantFence("before")
	const gap = 10 * defaultFenceGap // ten hours: well past the clock
	r := db(t, url, "fence", "bump", "--gap", fmt.Sprint(gap))
	after := floor()
	if r.code != exitOK || !strings.Contains(r.stdout, fmt.Sprintf("exceeds %d", after)) {
		t.Fatalf("fence bump --gap %d: exit %d, stdout %q; want 0 and 'exceeds %d'", gap, r.code, r.stdout, after)
	}
	if after < before+gap {
		t.Errorf("floor after bump = %d, want at least %d", after, before+gap)
	}
	if f := grantFence("after"); f <= after {
		t.Errorf("fence after bump = %d, want above the floor %d", f, after)
	}
	if r := db(t, url, "fence", "bump"); r.code != exitOK {
		t.Fatalf("fence bump: exit %d", r.code)
	}
	if got := floor(); got < after+defaultFenceGap {
		t.Errorf("floor after default bump = %d, want at least %d", got, after+defaultFenceGap)
	}

	for _, gap := range []string{"0", "-5"} {
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), "fence", "bump", "--gap", gap)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--gap must be at least 1") {
			t.Errorf("fence bump --gap %s: exit %d, stderr %q; want %d, '--gap must be at least 1'", gap, r.code, r.stderr, exitUsage)
		}
	}

	_, roleURL := pgtest.LoginRole(t, url, "IN ROLE pgfence_client")
	if r := db(t, roleURL, "fence", "bump"); r.code != exitFailure || !strings.Contains(r.stderr, "only pgfence_operator") {
		t.Errorf("fence bump as an application role: exit %d, stderr %q; want 1 and who may bump", r.code, r.stderr)
	}
}

// A role or database may set default_transaction_read_only = on, on a
// primary: fence bump then fails with the SQLSTATE a standby raises. It
// said "this server is a standby; connect to the primary", which this
// server was; it names the setting too.
func TestFenceBumpReadOnlyDefault(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	r := db(t, u+sep+"options=-c%20default_transaction_read_only%3Don", "fence", "bump")
	if r.code != exitFailure || !strings.Contains(r.stderr, "default_transaction_read_only") {
		t.Fatalf("fence bump in a read-only session: exit %d, stderr %q; want %d and default_transaction_read_only named", r.code, r.stderr, exitFailure)
	}
}

// The fence floor may rise to 2^62-1 at most (pgfence.bump_fence keeps
// the upper half of bigint for the clock). A --gap that can never fit
// whatever the database holds is a usage error, before connecting; one that
// does not fit above the current fences fails (exit 1: it depends on the
// database) with a message that says to give a smaller --gap.
func TestFenceBumpGapTooLarge(t *testing.T) {
	t.Parallel()
	for _, gap := range []string{"9223372036854775807", "4611686018427387903"} {
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), "fence", "bump", "--gap", gap)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--gap must be below 4611686018427387903") {
			t.Errorf("fence bump --gap %s: exit %d, stderr %q; want %d, '--gap must be below 4611686018427387903'", gap, r.code, r.stderr, exitUsage)
		}
	}
	url := pgtest.URL(t)
	r := db(t, url, "fence", "bump", "--gap", "4611686018427387902")
	if r.code != exitFailure || !strings.Contains(r.stderr, "give a smaller --gap") {
		t.Errorf("fence bump --gap 4611686018427387902: exit %d, stderr %q; want %d, 'give a smaller --gap'", r.code, r.stderr, exitFailure)
	}
}
