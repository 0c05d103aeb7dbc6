package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// leases prune deletes the rows expired before --older-than, in batches,
// keeps live and recently expired ones, refuses bad flags before
// connecting, and tells an application role who may prune.
func TestLeasesPrune(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, name := range []string{"old/1", "old/2", "old/3", "recent", "live"} {
		if _, err := conn.Exec(ctx, `SELECT FROM pgfence.try_acquire($1, 'test', 3600000000)`, name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `UPDATE pgfence.leases SET expires_at = clock_timestamp() - interval '2 hours' WHERE name LIKE 'old/%';
UPDATE pgfence.leases SET expires_at = clock_timestamp() - interval '1 minute' WHERE name = 'recent'`); err != nil {
		t.Fatal(err)
	}
	r := db(t, url, "leases", "prune", "--older-than", "1h", "--batch", "2")
	if r.code != exitOK || !strings.Contains(r.stdout, "deleted 3 lease rows expired more than 1h0m0s ago") {
		t.Fatalf("leases prune --older-than 1h --batch 2: exit %d, stdout %q, stderr %q; want 0 and 3 deleted", r.code, r.stdout, r.stderr)
	}
	rows, _ := conn.Query(ctx, `SELECT name FROM pgfence.leases ORDER BY name`)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(left, ",") != "live,recent" {
		t.Errorf("rows after prune = %v, want [live recent]", left)
	}
	if r := db(t, url, "leases", "prune"); r.code != exitOK || !strings.Contains(r.stdout, "deleted 0 lease rows expired more than 168h0m0s ago") {
		t.Errorf("leases prune (a week): exit %d, stdout %q; want 0 and nothing deleted", r.code, r.stdout)
	}

	for _, tc := range []struct{ args, want string }{
		{"--older-than -1s", "--older-than must not be negative"},
		{"--batch 0", "--batch must be between 1 and 1000000"},
	} {
		args := append([]string{"leases", "prune"}, strings.Fields(tc.args)...)
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("leases prune %s: exit %d, stderr %q; want %d, %q", tc.args, r.code, r.stderr, exitUsage, tc.want)
		}
	}

	_, roleURL := pgtest.LoginRole(t, url, "IN ROLE pgfence_client")
	if r := db(t, roleURL, "leases", "prune"); r.code != exitFailure || !strings.Contains(r.stderr, "only pgfence_operator") {
		t.Errorf("leases prune as an application role: exit %d, stderr %q; want 1 and who may prune", r.code, r.stderr)
	}
}
