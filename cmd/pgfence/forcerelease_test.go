package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// `leases release --force` behind a holder frozen inside an open fenced
// transaction: without --terminate it fails within --timeout and names the
// holder's backend; with --terminate it ends that backend and releases.
func TestForceReleaseFrozenHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "frozen-holder"
	frozen, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer frozen.Close(ctx)
	var fence int64
	if err := frozen.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('stuck', 'holder', 600000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	pid := strconv.FormatUint(uint64(frozen.PgConn().PID()), 10)
	for _, q := range []string{
		`CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('work')`,
		`BEGIN`,
		`SELECT pgfence.declare_token('stuck', ` + strconv.FormatInt(fence, 10) + `)`,
		`INSERT INTO work VALUES (1)`, // the lease row stays share-locked: the holder "freezes" here
	} {
		if _, err := frozen.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	start := time.Now()
	r := db(t, url, "leases", "release", "--force", "--timeout", "300ms", "stuck")
	if r.code != exitFailure || !strings.Contains(r.stderr, "pid "+pid) || !strings.Contains(r.stderr, "frozen-holder") || !strings.Contains(r.stderr, "--terminate") {
		t.Fatalf("release --force behind a frozen holder: exit %d, stderr %q; want 1 naming pid %s (frozen-holder) and --terminate", r.code, r.stderr, pid)
	}
	if took := time.Since(start); took > 30*time.Second { // 300ms plus process start on a loaded machine
		t.Errorf("release --force --timeout 300ms took %v", took)
	}
	r = db(t, url, "leases", "release", "--force", "--timeout", "300ms", "--terminate", "stuck")
	if r.code != exitOK || !strings.Contains(r.stdout, `released lease "stuck"`) {
		t.Fatalf("release --force --terminate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if _, err := frozen.Exec(ctx, `SELECT 1`); err == nil {
		t.Error("the frozen holder's session survived --terminate")
	}
	for _, bad := range []string{"0s", "2h"} {
		if r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), "leases", "release", "--force", "--timeout", bad, "x"); r.code != exitUsage {
			t.Errorf("--timeout %s: exit %d, want %d", bad, r.code, exitUsage)
		}
	}
}

// `leases release --force` behind a fenced write in a prepared transaction
// (a two-phase commit coordinator gone between PREPARE and COMMIT
// PREPARED): the error names the transaction by its GID and says how it
// ends; --terminate, which has no backend to end, does not claim to have
// ended one or suggest itself. After ROLLBACK PREPARED the release works.
func TestForceReleasePreparedTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := preparedCluster(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var fence int64
	if err := conn.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('stuck', 'holder', 600000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('work')`,
		`BEGIN`,
		`SELECT pgfence.declare_token('stuck', ` + strconv.FormatInt(fence, 10) + `)`,
		`INSERT INTO work VALUES (1)`,
		`PREPARE TRANSACTION 'xa-7'`, // the coordinator never comes back
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	for _, args := range [][]string{{}, {"--terminate"}} {
		r := db(t, url, append([]string{"leases", "release", "--force", "--timeout", "300ms", "stuck"}, args...)...)
		if r.code != exitFailure || !strings.Contains(r.stderr, `prepared transaction "xa-7"`) || !strings.Contains(r.stderr, "ROLLBACK PREPARED") ||
			strings.Contains(r.stderr, "add --terminate") || strings.Contains(r.stderr, "terminated") {
			t.Errorf("release --force %v behind a prepared transaction: exit %d, stderr %q; want 1 naming xa-7 and ROLLBACK PREPARED, neither suggesting nor reporting --terminate",
				args, r.code, r.stderr)
		}
	}
	if _, err := conn.Exec(ctx, `ROLLBACK PREPARED 'xa-7'`); err != nil {
		t.Fatal(err)
	}
	if r := db(t, url, "leases", "release", "--force", "--timeout", "300ms", "stuck"); r.code != exitOK {
		t.Fatalf("release --force after ROLLBACK PREPARED: exit %d, stderr %q", r.code, r.stderr)
	}
}

// preparedCluster returns the URL of a migrated database on a throwaway
// cluster of t's own that allows prepared transactions
// (max_prepared_transactions is 0 by default, and a server setting).
func preparedCluster(t *testing.T) string {
	t.Helper()
	c := pgtest.StartCluster(t, pgtest.WithSetting("max_prepared_transactions", "2"))
	url := c.URL("postgres")
	if err := migrations.Up(context.Background(), url); err != nil {
		t.Fatal(err)
	}
	return url
}
