package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// `leases handover`: a holder that never releases is reported after
// --timeout (exit 1) and keeps the lease; `leases ls` shows the data the
// grant published; a free lease exits 1; a bad timeout exits 2.
func TestLeasesHandover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.try_acquire('web/leader', 'pod-1', 600000000, '{"addr":"10.0.0.1:80"}')`); err != nil {
		t.Fatal(err)
	}
	r := db(t, url, "leases", "ls")
	if r.code != exitOK || !strings.Contains(r.stdout, `{"addr": "10.0.0.1:80"}`) {
		t.Errorf("ls: exit %d, stdout %q; want the data shown", r.code, r.stdout)
	}
	start := time.Now()
	r = db(t, url, "leases", "handover", "--timeout", "500ms", "web/leader")
	if r.code != exitFailure || !strings.Contains(r.stderr, "pod-1") || !strings.Contains(r.stderr, "keeps the lease") {
		t.Errorf("handover of a holder that ignores it: exit %d, stderr %q; want 1 naming pod-1", r.code, r.stderr)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("handover --timeout 500ms took %s", took)
	}
	var owner string
	var asked bool
	if err := conn.QueryRow(ctx, `SELECT owner, handover_fence = fence FROM pgfence.leases WHERE name = 'web/leader' AND expires_at > clock_timestamp()`).Scan(&owner, &asked); err != nil || owner != "pod-1" || !asked {
		t.Errorf("after the timeout: owner %q, asked %v, %v; want pod-1 still holding, asked", owner, asked, err)
	}
	if r := db(t, url, "leases", "handover", "nobody"); r.code != exitFailure || !strings.Contains(r.stderr, "not held") {
		t.Errorf("handover of a free lease: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := db(t, url, "leases", "handover", "--timeout", "0s", "web/leader"); r.code != exitUsage {
		t.Errorf("handover --timeout 0s: exit %d, want %d", r.code, exitUsage)
	}
}
