package main

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// pgfence bench with a tiny duration prints a row per operation and
// concurrency with parseable rates and ratios, exits 0, and leaves
// neither its schema nor any lease row or advisory lock behind.
func TestBench(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	r := db(t, url, "bench", "--duration", "100ms", "--concurrency", "1,3")
	if r.code != 0 {
		t.Fatalf("bench: exit %d; stderr:\n%s", r.code, r.stderr)
	}
	cols := regexp.MustCompile(`\s{2,}`)
	seen := map[string]bool{}
	for line := range strings.SplitSeq(r.stdout, "\n") {
		f := cols.Split(strings.TrimSpace(line), -1)
		if len(f) != 9 || f[0] == "OPERATION" {
			continue
		}
		seen[f[0]+"/"+f[1]] = true
		for i, col := range []string{"pgfence ops/s", "raw ops/s", "ratio"} {
			v, err := strconv.ParseFloat(f[2+i], 64)
			if err != nil || v <= 0 {
				t.Errorf("%s: %s %q is not a positive number", line, col, f[2+i])
			}
		}
		for _, lat := range f[5:] {
			d, err := time.ParseDuration(lat)
			if err != nil || d <= 0 {
				t.Errorf("%s: latency %q is not a positive duration", line, lat)
			}
		}
	}
	for _, op := range []string{"lease TryAcquire+Release", "advisory TryLock+Unlock", "fenced UPDATE"} {
		for _, c := range []string{"1", "3"} {
			if !seen[op+"/"+c] {
				t.Errorf("no row for %s at concurrency %s in:\n%s", op, c, r.stdout)
			}
		}
	}

	pool := pgtest.PoolFor(t, url)
	ctx := context.Background()
	var schemas, held, locks int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfence_bench'`).Scan(&schemas); err != nil {
		t.Fatal(err)
	}
	// Lease rows stay (expired) after release, by design; none may be live.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE expires_at > clock_timestamp()`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&locks); err != nil {
		t.Fatal(err)
	}
	if schemas != 0 || held != 0 || locks != 0 {
		t.Errorf("after bench: %d pgfence_bench schemas, %d live leases, %d advisory locks; want none", schemas, held, locks)
	}
}

// An interrupted bench releases the leases its workers hold: it uses the
// same names each run, so a lease left held (a release sent on the
// interrupted context) would fail the next run for the lease's minute.
// Each round interrupts the lease cycle of 8 workers once their leases
// come and go; a round whose signal lands between the pgfence slices
// proves nothing, so there are several.
func TestBenchInterruptReleases(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ctx := context.Background()
	cycles := func() (n int64) {
		if err := pool.QueryRow(ctx, `SELECT coalesce(sum(fence), 0) FROM pgfence.leases WHERE name LIKE 'pgfence-bench/lease/%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for round := range 5 {
		p := startCLI(t, cliEnv(), "--database-url", url, "bench", "--duration", "30s", "--concurrency", "8")
		p.line() // the header: setup is done and the lease cycles start
		before := cycles()
		pgtest.WaitFor(t, cliTimeout, "the bench's lease cycles", func() bool { return cycles() != before })
		if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		p.wait()
		var live []string
		rows, err := pool.Query(ctx, `SELECT name FROM pgfence.leases WHERE expires_at > clock_timestamp()`)
		if err == nil {
			live, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(live) > 0 {
			t.Fatalf("round %d: leases still held after an interrupted bench: %q", round, live)
		}
	}
}

func TestBenchBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"bench", "--duration", "0s"},
		{"bench", "--concurrency", "0"},
		{"bench", "--concurrency", "1000"},
	} {
		r := cli(t, cliEnv(), args...)
		if r.code != exitUsage {
			t.Errorf("pgfence %v: exit %d, want %d (usage)", args, r.code, exitUsage)
		}
	}
}
