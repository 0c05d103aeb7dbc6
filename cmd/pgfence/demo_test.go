package main

import (
	"context"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The demo's own check passes, and the database agrees: one row per
// period, fences increasing with the period (every grant takes a higher
// fence, and period n+1 is granted after period n is written).
func TestDemo(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	r := cli(t, cliEnv(), "demo", "--workers", "3", "--periods", "4", "--ttl", "1s", "--database-url", url)
	if r.code != 0 {
		t.Fatalf("demo: exit %d", r.code)
	}
	if !strings.Contains(r.stdout, "each period done exactly once: ok; stale writes rejected: 1") {
		t.Errorf("demo did not report a passing check:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "frozen (SIGSTOP)") || !strings.Contains(r.stdout, "rejected by the database: stale") {
		t.Errorf("demo did not narrate the frozen worker:\n%s", r.stdout)
	}

	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), "SELECT period, worker, fence FROM pgfence_demo.periods ORDER BY period")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n, last := 0, int64(0)
	for rows.Next() {
		var period int
		var worker string
		var fence int64
		if err := rows.Scan(&period, &worker, &fence); err != nil {
			t.Fatal(err)
		}
		n++
		if period != n || fence <= last || !strings.HasPrefix(worker, "w") {
			t.Errorf("row %d: period %d worker %q fence %d (previous fence %d)", n, period, worker, fence, last)
		}
		last = fence
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("%d rows, want 4", n)
	}
}

// With no database configured, demo starts (and stops) a throwaway
// PostgreSQL from the machine's binaries.
func TestDemoThrowawayServer(t *testing.T) {
	t.Parallel()
	r := cli(t, cliEnv(), "demo", "--workers", "2", "--periods", "2", "--ttl", "1s")
	if r.code != 0 {
		t.Fatalf("demo without a database: exit %d", r.code)
	}
	if !strings.Contains(r.stdout, "each period done exactly once: ok") {
		t.Errorf("demo output:\n%s", r.stdout)
	}
	m := regexp.MustCompile(`started a throwaway PostgreSQL on (127\.0\.0\.1:\d+)`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("demo does not say where it started PostgreSQL:\n%s", r.stdout)
	}
	// The server is gone once demo has exited.
	if c, err := net.DialTimeout("tcp", m[1], 5*time.Second); err == nil {
		c.Close()
		t.Errorf("the throwaway server at %s still accepts connections after demo exited", m[1])
	}
}
