package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// fence bump advances the sequence by --gap (default 2^32), so the next
// lease's fence exceeds it; bad gaps are usage errors that connect nowhere,
// and a role that did not migrate is told who may bump.
func TestFenceBump(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	lastValue := func() int64 {
		t.Helper()
		var v int64
		if err := conn.QueryRow(ctx, `SELECT last_value FROM pgfence.fence_seq`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}

	before := lastValue()
	r := db(t, url, "fence", "bump", "--gap", "1000")
	if r.code != exitOK || !strings.Contains(r.stdout, fmt.Sprintf("exceeds %d", before+1000)) {
		t.Fatalf("fence bump --gap 1000: exit %d, stdout %q; want 0 and 'exceeds %d'", r.code, r.stdout, before+1000)
	}
	if got := lastValue(); got != before+1000 {
		t.Errorf("sequence after bump = %d, want %d", got, before+1000)
	}
	before = lastValue()
	if r := db(t, url, "fence", "bump"); r.code != exitOK {
		t.Fatalf("fence bump: exit %d", r.code)
	}
	if got := lastValue(); got != before+defaultFenceGap {
		t.Errorf("sequence after default bump = %d, want %d", got, before+defaultFenceGap)
	}
	var f int64
	if err := conn.QueryRow(ctx, `SELECT pgfence.next_fence()`).Scan(&f); err != nil || f != before+defaultFenceGap+1 {
		t.Errorf("next fence after bump = %d, %v; want %d", f, err, before+defaultFenceGap+1)
	}

	for _, gap := range []string{"0", "-5"} {
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), "fence", "bump", "--gap", gap)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--gap must be at least 1") {
			t.Errorf("fence bump --gap %s: exit %d, stderr %q; want %d, '--gap must be at least 1'", gap, r.code, r.stderr, exitUsage)
		}
	}

	role, roleURL := newRole(t, url)
	if _, err := conn.Exec(ctx, `GRANT USAGE ON SCHEMA pgfence TO `+pgx.Identifier{role}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if r := db(t, roleURL, "fence", "bump"); r.code != exitFailure || !strings.Contains(r.stderr, "EXECUTE ON FUNCTION pgfence.bump_fence") {
		t.Errorf("fence bump as an application role: exit %d, stderr %q; want 1 and who may bump", r.code, r.stderr)
	}
}
