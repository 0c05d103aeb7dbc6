package main

import (
	"context"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
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

// A demo worker stopped (SIGTERM, as `compose stop` does) while its fenced
// write is in flight lets the write finish and reports it: a commit cut by
// a cancelled context would leave the worker unable to say whether it did
// the period, and the table and the workers' reports would disagree.
func TestDemoWorkerStopFinishesWrite(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	if r := db(t, url, "demo", "worker", "--name", "first", "--first", "1", "--periods", "1", "--work", "0"); r.code != 0 {
		t.Fatalf("first worker: exit %d", r.code)
	}
	pool := pgtest.PoolFor(t, url)
	ctx := context.Background()
	// Period 2's write is slow: long enough to stop the worker inside it.
	if _, err := pool.Exec(ctx, `
		CREATE FUNCTION public.demo_slow() RETURNS trigger LANGUAGE plpgsql AS
		  $$BEGIN PERFORM pg_sleep(2); RETURN NEW; END$$;
		CREATE TRIGGER slow BEFORE INSERT ON pgfence_demo.periods
		  FOR EACH ROW EXECUTE FUNCTION public.demo_slow()`); err != nil {
		t.Fatal(err)
	}
	p := startCLI(t, cliEnv("DATABASE_URL="+url), "demo", "worker", "--name", "stopped", "--first", "2", "--periods", "1", "--work", "0")
	pgtest.WaitFor(t, cliTimeout, "the worker's write to run the slow trigger", func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event = 'PgSleep' AND application_name LIKE 'pgfence demo worker stopped%'`).Scan(&n)
		if err != nil {
			t.Fatalf("look for the write: %v", err)
		}
		return n == 1
	})
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	var out []string
	for l := range p.lines {
		out = append(out, l)
	}
	if code := p.wait(); code != 0 {
		t.Errorf("stopped worker: exit %d, want 0", code)
	}
	var writer string
	if err := pool.QueryRow(ctx, `SELECT worker FROM pgfence_demo.periods WHERE period = 2`).Scan(&writer); err != nil {
		t.Fatalf("period 2's row: %v (worker said %q)", err, out)
	}
	if writer != "stopped" || !slices.ContainsFunc(out, func(l string) bool { return strings.HasPrefix(l, "stopped: period 2: did the work") }) {
		t.Errorf("period 2 written by %q; the stopped worker said %q", writer, out)
	}
}

// Under repeatable read and serializable a fenced write whose lease row
// changed after the transaction's snapshot fails with a serialization
// failure (SQLSTATE 40001) instead of PF001 — a stale one as much as the
// current holder's after its own renewal — and fencing/doc.go says to retry
// it. The test makes it happen to the frozen worker's write: a trigger that
// runs before the guard holds the write, on an advisory lock the test
// holds, while the test takes and releases the period's lease itself. The
// demo still passes, the write is refused as stale, and the data show it did
// not land. One level comes from the database's defaults (as ALTER ROLE ...
// SET would give it), the other from the connection string's options.
func TestDemoIsolationLevels(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, level string }{
		{"database default serializable", "serializable"},
		{"connection option repeatable read", "repeatable read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := pgtest.URL(t)
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if tc.level == "serializable" {
				if _, err := conn.Exec(ctx, `DO $$BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = serializable', current_database()); END$$`); err != nil {
					t.Fatal(err)
				}
			} else {
				url = pgtest.WithSettings(url, `default_transaction_isolation=repeatable\ read`)
			}
			check, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			var level string
			err = check.QueryRow(ctx, "SHOW default_transaction_isolation").Scan(&level)
			check.Close(ctx)
			if err != nil || level != tc.level {
				t.Fatalf("the workers' sessions would run at %q (%v), want %q", level, err, tc.level)
			}
			// The trigger waits for this lock; only a write of a period that
			// is done already (the frozen worker's) gets there.
			const holdKey = 7301
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", holdKey); err != nil {
				t.Fatal(err)
			}

			// --work 1s: the test installs the trigger once demo has
			// (re)created the table, well before period 2's write.
			p := startCLI(t, cliEnv(), "demo", "--workers", "3", "--periods", "3", "--ttl", "1s", "--work", "1s", "--database-url", url)
			pgtest.WaitFor(t, cliTimeout, "demo to create its table", func() bool {
				var exists bool
				err := conn.QueryRow(ctx, "SELECT to_regclass('pgfence_demo.periods') IS NOT NULL").Scan(&exists)
				return err == nil && exists
			})
			if _, err := conn.Exec(ctx, `
				CREATE FUNCTION pgfence_demo.hold() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
				  IF EXISTS (SELECT FROM pgfence_demo.periods WHERE period = NEW.period) THEN
				    PERFORM pg_advisory_xact_lock(7301);
				  END IF;
				  RETURN NEW;
				END$$;
				CREATE TRIGGER a_hold BEFORE INSERT ON pgfence_demo.periods
				  FOR EACH ROW EXECUTE FUNCTION pgfence_demo.hold()`); err != nil {
				t.Fatal(err)
			}
			pgtest.WaitFor(t, cliTimeout, "the frozen worker's write to wait on the trigger", func() bool {
				var n int
				err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks
					WHERE locktype = 'advisory' AND NOT granted AND objid = $1
					  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, holdKey).Scan(&n)
				return err == nil && n == 1
			})
			// The period's lease changes after the write's snapshot.
			if r := db(t, url, "run", "--lease", "demo/period/2", "--ttl", "1s", "--", "true"); r.code != 0 {
				t.Fatalf("take and release demo/period/2: exit %d", r.code)
			}
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", holdKey); err != nil {
				t.Fatal(err)
			}
			var out []string
			for l := range p.lines {
				out = append(out, l)
			}
			stdout := strings.Join(out, "\n")
			if code := p.wait(); code != 0 {
				t.Fatalf("demo at %s: exit %d:\n%s", tc.level, code, stdout)
			}
			if !strings.Contains(stdout, "each period done exactly once: ok; stale writes rejected: 1") {
				t.Errorf("demo at %s did not report a passing check:\n%s", tc.level, stdout)
			}
			if !strings.Contains(stdout, "was rejected by the database: stale (retried after a serialization failure)") {
				t.Errorf("the frozen worker's write did not meet the serialization failure the test set up:\n%s", stdout)
			}
			// The frozen worker wrote nothing: period 2's row is its
			// successor's, with a higher fence.
			m := regexp.MustCompile(`period 2: (w\d+) resumed \(SIGCONT\) and writes with its old fence (\d+)`).FindStringSubmatch(stdout)
			if m == nil {
				t.Fatalf("demo did not narrate the frozen worker's write:\n%s", stdout)
			}
			var writer string
			var fence int64
			if err := conn.QueryRow(ctx, "SELECT worker, fence FROM pgfence_demo.periods WHERE period = 2").Scan(&writer, &fence); err != nil {
				t.Fatal(err)
			}
			if old, _ := strconv.ParseInt(m[2], 10, 64); writer == m[1] || fence <= old {
				t.Errorf("period 2 was written by %s with fence %d; the frozen worker %s had fence %d", writer, fence, m[1], old)
			}
		})
	}
}
