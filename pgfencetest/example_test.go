package pgfencetest_test

// This file is the example of docs/testing-with-pgfencetest.md: a user's
// job that must run exactly once per day whichever replica gets there
// first, and its tests.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pgfencetest"
)

// runInvoices is the job under test: produce day's invoices once. It takes
// the day's lease, skips the day if it is done, works, and records the run
// in a fenced transaction, so that a replica that lost its lease while it
// worked (a long pause) is rejected by the database.
func runInvoices(ctx context.Context, pool *pgxpool.Pool, lc *leases.Client, day int, work func()) (string, error) {
	lease, err := lc.Acquire(ctx, "invoices/"+strconv.Itoa(day), 2*time.Second)
	if err != nil {
		return "", err
	}
	defer lease.Release(context.WithoutCancel(ctx)) //nolint:errcheck // fails once lost; expiry covers it
	var done bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM invoice_runs WHERE day = $1)`, day).Scan(&done); err != nil {
		return "", err
	}
	if done {
		return "skipped", nil
	}
	work()
	err = fencing.InTx(ctx, pool, lease.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoice_runs (day, replica) VALUES ($1, $2)`, day, lease.Owner())
		return err
	})
	switch {
	case fencing.IsStale(err):
		return "stale", nil
	case err != nil:
		return "", err
	}
	return "wrote", nil
}

// setup gives the test a migrated database with the job's table,
// protected by pgfence's fence guard. No primary key on day: a second run
// of a day must show, not fail.
func setup(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	pool := pgfencetest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE invoice_runs (day int NOT NULL, replica text NOT NULL, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if err := fencing.Protect(ctx, pool, "invoice_runs"); err != nil {
		t.Fatal(err)
	}
	return pool.Config().ConnString(), pool
}

func newReplica(t *testing.T, pool *pgxpool.Pool, name string) *leases.Client {
	t.Helper()
	lc, err := leases.New(pool, leases.WithOwner(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lc.Close() })
	return lc
}

// runsPerDay counts the recorded runs of each day.
func runsPerDay(t *testing.T, pool *pgxpool.Pool) map[int]int {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT day, count(*) FROM invoice_runs GROUP BY day`)
	if err != nil {
		t.Fatal(err)
	}
	runs := map[int]int{}
	for rows.Next() {
		var day, n int
		if err := rows.Scan(&day, &n); err != nil {
			t.Fatal(err)
		}
		runs[day] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

// Three replicas race through five days: each day runs exactly once.
func TestInvoicesExactlyOnce(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for r := range 3 {
		lc := newReplica(t, pool, fmt.Sprintf("replica-%d", r))
		wg.Go(func() {
			for day := 1; day <= 5; day++ {
				if _, err := runInvoices(ctx, pool, lc, day, func() { time.Sleep(50 * time.Millisecond) }); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	runs := runsPerDay(t, pool)
	for day := 1; day <= 5; day++ {
		if runs[day] != 1 {
			t.Errorf("day %d ran %d times, want once", day, runs[day])
		}
	}
}

// envReplica makes the test binary a replica process (see TestMain).
const envReplica = "PGFENCETEST_EXAMPLE_REPLICA"

// A replica frozen (SIGSTOP) while it works on day 1 loses its lease;
// another replica runs day 1; the frozen one, resumed, is rejected.
func TestPausedReplicaIsFenced(t *testing.T) {
	t.Parallel()
	url, pool := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envReplica+"="+url)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe() // closed: the replica's work is done
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "working" {
		t.Fatalf("replica: want working, got %q (%v)", lines.Text(), lines.Err())
	}
	resume := pgfencetest.PauseProcess(t, cmd.Process)

	// Acquire waits for the frozen replica's lease to expire.
	got, err := runInvoices(ctx, pool, newReplica(t, pool, "replica-b"), 1, func() {})
	if err != nil || got != "wrote" {
		t.Fatalf("replica-b on day 1: %q, %v; want wrote", got, err)
	}
	resume()
	_ = in.Close()
	if !lines.Scan() || lines.Text() != "stale" {
		t.Fatalf("the resumed replica: want stale, got %q (%v)", lines.Text(), lines.Err())
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("replica: %v", err)
	}
	if runs := runsPerDay(t, pool); runs[1] != 1 {
		t.Fatalf("day 1 ran %d times, want once", runs[1])
	}
}

// replica is the child process of TestPausedReplicaIsFenced: it runs day 1,
// saying "working" as its work begins and then the outcome. The work lasts
// until the test closes the replica's stdin, so that the test freezes it
// mid-work however slow the machine is.
func replica(url string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer pool.Close()
	lc, err := leases.New(pool, leases.WithOwner("replica-a"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer lc.Close()
	got, err := runInvoices(ctx, pool, lc, 1, func() {
		fmt.Println("working")
		_, _ = io.Copy(io.Discard, os.Stdin)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(got)
	return 0
}

func TestMain(m *testing.M) {
	if url := os.Getenv(envReplica); url != "" {
		os.Exit(replica(url))
	}
	pgfencetest.Main(m)
}
