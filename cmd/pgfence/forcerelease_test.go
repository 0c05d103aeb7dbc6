package main

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// frozenFencedHolder grants lease name for ttlMicros to a session named
// frozen-holder, which then opens a fenced transaction that writes and
// never ends: the lease's fence lock stays held. It is closed when t ends.
func frozenFencedHolder(t *testing.T, url, name string, ttlMicros int64) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "frozen-holder"
	frozen, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = frozen.Close(context.Background()) })
	var fence int64
	if err := frozen.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire($1, 'holder', $2) WHERE granted`, name, ttlMicros).Scan(&fence); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('work')`,
		`BEGIN`,
		`SELECT pgfence.declare_token(` + quoteLiteral(name) + `, ` + strconv.FormatInt(fence, 10) + `)`,
		`INSERT INTO work VALUES (1)`, // the holder "freezes" here
	} {
		if _, err := frozen.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return frozen
}

// `leases release --force` behind a holder frozen inside an open fenced
// transaction: without --terminate it fails within --timeout and names the
// holder's backend; with --terminate it ends that backend and releases.
func TestForceReleaseFrozenHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	frozen := frozenFencedHolder(t, url, "stuck", 600_000_000)
	pid := strconv.FormatUint(uint64(frozen.PgConn().PID()), 10)

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

// `leases release --force --terminate` whose grant expired while it waited
// for the blocking backend (or whose holder let go once it was ended, as
// pgfence run does): the lease is free, as asked. It reported "not held
// ... nothing to release" and exited 1.
func TestForceReleaseTerminateAfterExpiry(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	frozenFencedHolder(t, url, "expiring", 2_000_000) // 2s; the release waits 5s
	r := db(t, url, "leases", "release", "--force", "--timeout", "5s", "--terminate", "expiring")
	if r.code != exitOK || !strings.Contains(r.stdout, `lease "expiring" is free now`) {
		t.Fatalf("release --force --terminate of a grant that expired meanwhile: exit %d, stdout %q, stderr %q; want 0, free", r.code, r.stdout, r.stderr)
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

// TestForceReleaseTerminateSparesAWaitingTakeover (scenario: a lease has
// expired, its holder is frozen inside an open fenced transaction, and a
// replica's takeover waits behind it for the fence lock; the operator runs
// `leases release --force --terminate`). The command ends the frozen
// holder's backend only — not the replica's, which pg_blocking_pids also
// lists because it is queued ahead — and does not force-release the grant
// the replica then gets: exit 1, naming it.
func TestForceReleaseTerminateSparesAWaitingTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	frozen := frozenFencedHolder(t, url, "stuck", 1_000_000)
	pool := pgtest.PoolFor(t, url)
	awaitExpiry(t, pool, "stuck")
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "replica-takeover"
	replica, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close(ctx)
	took := make(chan error, 1)
	go func() {
		var granted bool
		err := replica.QueryRow(ctx, `SELECT granted FROM pgfence.try_acquire('stuck', 'replica', 600000000)`).Scan(&granted)
		if err == nil && !granted {
			err = errors.New("not granted")
		}
		took <- err
	}()
	pgtest.WaitFor(t, 30*time.Second, "the takeover to wait for the fence lock", func() bool {
		var waiting bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)`, int32(replica.PgConn().PID())).Scan(&waiting)
		return err == nil && waiting
	})

	r := db(t, url, "leases", "release", "--force", "--timeout", "500ms", "--terminate", "stuck")
	if err := <-took; err != nil {
		t.Fatalf("the replica's takeover: %v", err)
	}
	if _, err := frozen.Exec(ctx, `SELECT 1`); err == nil {
		t.Error("the frozen holder's session survived --terminate")
	}
	var owner string
	var live bool
	if err := pool.QueryRow(ctx, `SELECT owner, expires_at > clock_timestamp() FROM pgfence.leases WHERE name = 'stuck'`).Scan(&owner, &live); err != nil {
		t.Fatal(err)
	}
	if owner != "replica" || !live {
		t.Errorf("lease after the command: owner %q, live %v; want the replica's live grant", owner, live)
	}
	if r.code != exitFailure || !strings.Contains(r.stderr, "granted again") || !strings.Contains(r.stderr, "replica") {
		t.Errorf("release --force --terminate: exit %d, stdout %q, stderr %q; want 1 naming the replica's new grant", r.code, r.stdout, r.stderr)
	}
}

// TestRunNoWaitBehindAFrozenHolder (scenario: a cron job runs `pgfence run
// --no-wait` while the lease's last grant has expired but its holder is
// frozen inside an open fenced transaction, which a takeover must wait
// for). The run gives up within a bound and exits 75 saying why, instead
// of waiting — a hung pgfence and a backend more at every tick.
func TestRunNoWaitBehindAFrozenHolder(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	frozenFencedHolder(t, url, "nowait", 1_000_000)
	awaitExpiry(t, pgtest.PoolFor(t, url), "nowait")
	start := time.Now()
	r := db(t, url, "run", "--lease", "nowait", "--ttl", "5s", "--no-wait", "--", "echo", "ran")
	took := time.Since(start)
	if r.code != exitHeld || strings.Contains(r.stdout, "ran") || !strings.Contains(r.stderr, "fenced transaction") {
		t.Errorf("run --no-wait behind a frozen holder: exit %d, stdout %q, stderr %q; want %d saying a fenced transaction is open", r.code, r.stdout, r.stderr, exitHeld)
	}
	if took > 30*time.Second { // the 5s bound plus process start on a loaded machine
		t.Errorf("run --no-wait took %v", took)
	}
}

// awaitExpiry waits until the grant of lease name has expired by the
// database clock.
func awaitExpiry(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	pgtest.WaitFor(t, 30*time.Second, "the grant of "+name+" to expire", func() bool {
		var expired bool
		err := pool.QueryRow(context.Background(), `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = $1`, name).Scan(&expired)
		return err == nil && expired
	})
}

// run --no-wait whose grant waits for something other than a frozen
// holder — here an operator's lock on pgfence.leases, as a migration takes
// — does not claim the lease is held (75: "someone else is doing it", which
// a cron job treats as fine): the lease has no grant at all. The database
// did not answer in time: 69, as for the one-shot commands.
func TestRunNoWaitBehindALockedTable(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	lockLeasesTable(t, url)
	start := time.Now()
	r := db(t, url, "run", "--lease", "nobody-holds-it", "--ttl", "5s", "--no-wait", "--", "echo", "ran")
	took := time.Since(start)
	if r.code != exitUnavailable || strings.Contains(r.stdout, "ran") || strings.Contains(r.stderr, "fenced transaction of its holder") {
		t.Errorf("run --no-wait behind a locked table: exit %d, stdout %q, stderr %q; want %d, and no frozen holder claimed", r.code, r.stdout, r.stderr, exitUnavailable)
	}
	if !strings.Contains(r.stderr, "did not answer") {
		t.Errorf("stderr %q does not say the database did not answer", r.stderr)
	}
	if took > 40*time.Second { // two 5s bounds plus process start on a loaded machine
		t.Errorf("run --no-wait took %v", took)
	}
}
