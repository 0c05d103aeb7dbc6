package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/pglock"
)

// checkJSON runs check --json with args and decodes its object.
func checkJSON(t *testing.T, url string, args ...string) (checkReport, int) {
	t.Helper()
	r := db(t, url, append([]string{"check", "--json"}, args...)...)
	var rep checkReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("check --json %v (exit %d) did not print a JSON object: %v\n%s", args, r.code, err, r.stdout)
	}
	// Empty findings are [], never null, so that consumers can iterate.
	for _, k := range []string{"leases", "lock_waits", "unguarded", "blocked_takeovers"} {
		if !strings.Contains(r.stdout, `"`+k+`": [`) {
			t.Errorf("check --json: %s is not an array:\n%s", k, r.stdout)
		}
	}
	return rep, r.code
}

// Leases are reported when unexpired and acquired longer ago than
// --max-hold, judged by the database clock; the rows are written by SQL
// with times relative to it, so the outcome does not depend on timing.
func TestCheckLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	const insert = `
INSERT INTO pgfence.leases (name, owner, fence, acquired_at, renewed_at, expires_at)
VALUES ($1, $2, $5,
        clock_timestamp() - $3::interval, clock_timestamp(), clock_timestamp() + $4::interval)`
	for i, l := range []struct{ name, owner, heldFor, expiresIn string }{
		{"reports/stuck", "worker-a", "2 hours", "1 hour"},      // reported at 1h
		{"reports/expired", "worker-b", "3 hours", "-1 minute"}, // expired: never reported
		{"reports/fresh", "worker-c", "1 minute", "30 seconds"}, // held briefly
		{"reports/older", "worker-d", "5 hours", "10 minutes"},  // reported first: held longest
	} {
		if _, err := pool.Exec(ctx, insert, l.name, l.owner, l.heldFor, l.expiresIn, i+1); err != nil {
			t.Fatalf("insert lease %s: %v", l.name, err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET metadata = '{"shard": 7}' WHERE name = 'reports/older'`); err != nil {
		t.Fatal(err)
	}

	// Findings: exit 4, a CRITICAL header with counts and threshold, a table.
	r := db(t, url, "check", "--max-hold", "1h")
	if r.code != exitFindings {
		t.Fatalf("check --max-hold 1h: exit %d, want %d", r.code, exitFindings)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if want := "CRITICAL: 2 leases held longer than 1h0m0s, 0 advisory locks waited on longer than 1h0m0s"; lines[0] != want {
		t.Errorf("status line %q, want %q", lines[0], want)
	}
	for _, want := range []string{"NAME", "OWNER", "HELD FOR", "reports/stuck", "worker-a", "reports/older", "worker-d", "2h00m", "5h00m"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output does not show %q:\n%s", want, r.stdout)
		}
	}
	for _, absent := range []string{"reports/expired", "reports/fresh", "LOCK KEY"} {
		if strings.Contains(r.stdout, absent) {
			t.Errorf("check output shows %q:\n%s", absent, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("findings are not an error, but stderr says %q", r.stderr)
	}

	rep, code := checkJSON(t, url, "--max-hold", "1h")
	if code != exitFindings || rep.OK || rep.MaxHoldSeconds != 3600 || rep.MaxWaitSeconds != 3600 {
		t.Errorf("check --json --max-hold 1h: exit %d, %+v; want 4, ok false, thresholds 3600", code, rep)
	}
	if len(rep.Leases) != 2 || rep.Leases[0].Name != "reports/older" || rep.Leases[1].Name != "reports/stuck" {
		t.Fatalf("leases %+v, want reports/older then reports/stuck", rep.Leases)
	}
	s := rep.Leases[1]
	// held_for is 2h plus however long the test took to get here: bounded
	// by the CLI timeout.
	var data bytes.Buffer
	if err := json.Compact(&data, rep.Leases[0].Data); err != nil || data.String() != `{"shard":7}` || s.Data != nil {
		t.Errorf("data: %s and %s, want reports/older's (as leases ls --json shows it) and none", rep.Leases[0].Data, s.Data)
	}
	if s.Owner != "worker-a" || s.Fence <= 0 || s.Expired || s.HeldForSeconds == nil ||
		*s.HeldForSeconds < 7200 || *s.HeldForSeconds > 7200+cliTimeout.Seconds() || s.ExpiresInSeconds <= 0 || s.ExpiresInSeconds > 3600 || !s.ExpiresAt.After(s.AcquiredAt) {
		t.Errorf("reports/stuck reported as %+v (held for %v)", s, s.HeldForSeconds)
	}
	if len(rep.LockWaits) != 0 {
		t.Errorf("lock waits %+v in a database without advisory locks", rep.LockWaits)
	}

	// Nothing held longer than 6h: OK.
	r = db(t, url, "check", "--max-hold", "6h")
	if want := "OK: no lease held longer than 6h0m0s, no advisory lock waited on longer than 6h0m0s\n"; r.code != 0 || r.stdout != want {
		t.Errorf("check --max-hold 6h: exit %d, stdout %q; want 0 and %q", r.code, r.stdout, want)
	}
	rep, code = checkJSON(t, url, "--max-hold", "6h", "--max-wait", "90s")
	if code != 0 || !rep.OK || len(rep.Leases) != 0 || rep.MaxHoldSeconds != 6*3600 || rep.MaxWaitSeconds != 90 {
		t.Errorf("check --json --max-hold 6h --max-wait 90s: exit %d, %+v; want 0, ok, no leases", code, rep)
	}

	// The check only reads.
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 4 {
		t.Errorf("%d lease rows after check, want the 4 inserted", n)
	}
}

// A session blocked in pg_advisory_lock is reported once its wait is
// longer than --max-wait (default --max-hold), with its session and the
// holder's pid.
func TestCheckLockWaits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	key := pglock.Key("check/reindex")

	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		t.Fatal(err)
	}
	waiter, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Release()
	if _, err := waiter.Exec(ctx, `SET application_name = 'check-waiter'`); err != nil {
		t.Fatal(err)
	}
	holderPID, waiterPID := int32(holder.Conn().PgConn().PID()), int32(waiter.Conn().PgConn().PID())
	locked := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, `SELECT pg_advisory_lock($1)`, key)
		locked <- err
	}()
	// Whatever happens below, let the waiter finish before its connection
	// is released.
	unlocked := false
	defer func() {
		if !unlocked {
			_, _ = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key)
			<-locked
			_, _ = waiter.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
		}
	}()

	// Wait until the waiter has waited more than 1ms by the database clock
	// (waitstart is set a moment after the wait begins), so that a check
	// with a 1ms threshold must report it.
	deadline := time.Now().Add(cliTimeout)
	for {
		var waited bool
		if err := holder.QueryRow(ctx, `
SELECT coalesce(bool_or(clock_timestamp() - waitstart > interval '1ms'), false)
  FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1`, waiterPID).Scan(&waited); err != nil {
			t.Fatal(err)
		}
		if waited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never showed up waiting in pg_locks")
		}
		time.Sleep(10 * time.Millisecond) // polling a condition in another session
	}

	// The wait is far shorter than an hour: OK.
	if r := db(t, url, "check", "--max-hold", "1h"); r.code != 0 || !strings.HasPrefix(r.stdout, "OK: ") {
		t.Errorf("check --max-hold 1h: exit %d, stdout %q; want 0 and OK", r.code, r.stdout)
	}
	// --max-wait overrides --max-hold for lock waits.
	if r := db(t, url, "check", "--max-hold", "1ms", "--max-wait", "1h"); r.code != 0 {
		t.Errorf("check --max-hold 1ms --max-wait 1h: exit %d, want 0", r.code)
	}

	r := db(t, url, "check", "--max-hold", "1ms")
	if r.code != exitFindings {
		t.Fatalf("check --max-hold 1ms: exit %d, want %d", r.code, exitFindings)
	}
	if want := "CRITICAL: 0 leases held longer than 1ms, 1 advisory lock waited on longer than 1ms\n"; !strings.HasPrefix(r.stdout, want) {
		t.Errorf("status line of %q, want %q", r.stdout, want)
	}
	for _, want := range []string{"LOCK KEY", "WAITED", "HELD BY", strconv.FormatInt(key, 10), "ExclusiveLock",
		"check-waiter", strconv.Itoa(int(waiterPID)), strconv.Itoa(int(holderPID))} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output does not show %q:\n%s", want, r.stdout)
		}
	}

	rep, code := checkJSON(t, url, "--max-hold", "1h", "--max-wait", "1ms")
	if code != exitFindings || rep.OK || rep.MaxHoldSeconds != 3600 || rep.MaxWaitSeconds != 0.001 || len(rep.Leases) != 0 {
		t.Errorf("check --json --max-hold 1h --max-wait 1ms: exit %d, %+v", code, rep)
	}
	if len(rep.LockWaits) != 1 {
		t.Fatalf("lock waits %+v, want the one waiter", rep.LockWaits)
	}
	w := rep.LockWaits[0]
	if w.Key != key || w.PID != waiterPID || w.ApplicationName != "check-waiter" || w.Mode != "ExclusiveLock" ||
		w.WaitedSeconds <= 0.001 || w.WaitedSeconds > cliTimeout.Seconds() || w.WaitStart.IsZero() ||
		len(w.HeldBy) != 1 || w.HeldBy[0] != holderPID {
		t.Errorf("lock wait reported as %+v; want key %d, pid %d, held by %d", w, key, waiterPID, holderPID)
	}

	// Once the holder lets go, the waiter gets the lock and nothing waits.
	unlocked = true
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
	if err := <-locked; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if r := db(t, url, "check", "--max-hold", "1ms"); r.code != 0 {
		t.Errorf("check with the lock held but not waited for: exit %d, want 0", r.code)
	}
	if _, err := waiter.Exec(ctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
		t.Fatal(err)
	}
}

// Bad flags exit 2 before connecting: the URL points nowhere, and a check
// that connected would exit 69.
func TestCheckUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check"}, "check needs --max-hold"},
		{[]string{"check", "--json"}, "check needs --max-hold"},
		{[]string{"check", "--max-wait", "1m"}, "check needs --max-hold"},
		{[]string{"check", "--max-hold", "0s"}, "--max-hold must be positive"},
		{[]string{"check", "--max-hold", "-1h"}, "--max-hold must be positive"},
		{[]string{"check", "--max-hold", "1ns"}, "at least 1µs"},
		{[]string{"check", "--max-hold", "1h", "--max-wait", "0s"}, "--max-wait must be positive"},
		{[]string{"check", "--max-hold", "an hour"}, `invalid argument "an hour"`},
		{[]string{"check", "--max-hold", "1h", "extra"}, `unknown command "extra"`},
	} {
		r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || r.stdout != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 and %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}

	r := cli(t, cliEnv("DATABASE_URL="+unreachableURL), "check", "--max-hold", "1h")
	if r.code != exitUnavailable {
		t.Errorf("check on an unreachable database: exit %d, want %d", r.code, exitUnavailable)
	}
	r = db(t, pgtest.EmptyURL(t), "check", "--max-hold", "1h")
	if r.code != exitFailure || !strings.Contains(r.stderr, "run `pgfence migrate up`") {
		t.Errorf("check on an unmigrated database: exit %d, stderr %q; want 1 and the migrate hint", r.code, r.stderr)
	}
	r = cli(t, cliEnv(), "check", "--help")
	for _, want := range []string{"--max-hold", "--max-wait", "--json", "lease_status", "4 findings"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check --help does not mention %q", want)
		}
	}
	if r = cli(t, cliEnv(), "--help"); !strings.Contains(r.stdout, "4    check") {
		t.Errorf("pgfence --help does not list exit code 4")
	}
}

// A partition attached after protect is reported (exit 4, and in JSON)
// until protect runs again.
func TestCheckUnguarded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	for _, q := range []string{
		`CREATE TABLE parts (id int, fence bigint NOT NULL DEFAULT 0) PARTITION BY RANGE (id)`,
		`CREATE TABLE parts_1 PARTITION OF parts FOR VALUES FROM (0) TO (100)`,
		`SELECT pgfence.protect('parts')`,
		`CREATE TABLE parts_2 PARTITION OF parts FOR VALUES FROM (100) TO (200)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	r := db(t, url, "check", "--max-hold", "1h")
	if r.code != exitFindings || !strings.Contains(r.stdout, "1 table below a protected table unguarded") || !strings.Contains(r.stdout, "parts_2") {
		t.Fatalf("check with an unguarded partition: exit %d, stdout %q", r.code, r.stdout)
	}
	r = db(t, url, "check", "--max-hold", "1h", "--json")
	if r.code != exitFindings || !strings.Contains(r.stdout, `"table": "parts_2"`) {
		t.Fatalf("check --json with an unguarded partition: exit %d, stdout %q", r.code, r.stdout)
	}
	if _, err := pool.Exec(ctx, `SELECT pgfence.protect('parts')`); err != nil {
		t.Fatal(err)
	}
	if r := db(t, url, "check", "--max-hold", "1h"); r.code != exitOK {
		t.Fatalf("check after protect again: exit %d, stdout %q", r.code, r.stdout)
	}
}

// A lease takeover held back by an expired holder's open fenced
// transaction is reported once it has waited longer than --max-wait: one
// behind a frozen backend (named by pid), one behind a prepared transaction
// (named by GID: no pid shows it). Before, neither was reported: the
// takeover waits on a two-key advisory lock, which lock_waits leaves out.
func TestCheckBlockedTakeover(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := preparedCluster(t)
	conn := func(app string) *pgx.Conn {
		t.Helper()
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RuntimeParams["application_name"] = app
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(ctx) })
		return c
	}
	exec := func(c *pgx.Conn, sql ...string) {
		t.Helper()
		for _, q := range sql {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	admin := conn("admin")
	exec(admin, `CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`, `SELECT pgfence.protect('work')`)
	// Each holder writes under a 2s grant and stays in its transaction; one
	// prepares it.
	holders := map[string]*pgx.Conn{"frozen": conn("frozen-holder"), "prepared": conn("coordinator")}
	for i, name := range []string{"frozen", "prepared"} {
		h := holders[name]
		var fence int64
		if err := h.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire($1, 'holder', 2000000) WHERE granted`, name).Scan(&fence); err != nil {
			t.Fatal(err)
		}
		exec(h, `BEGIN`, `SELECT pgfence.declare_token('`+name+`', `+strconv.FormatInt(fence, 10)+`)`,
			`INSERT INTO work VALUES (`+strconv.Itoa(i)+`)`)
	}
	exec(holders["prepared"], `PREPARE TRANSACTION 'xa-9'`)
	pgtest.WaitFor(t, 30*time.Second, "both grants to expire", func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE expires_at <= clock_timestamp()`).Scan(&n)
		return err == nil && n == 2
	})
	granted := make(chan error, 2)
	for _, name := range []string{"frozen", "prepared"} {
		taker := conn("taker-" + name)
		go func() {
			var ok bool
			err := taker.QueryRow(ctx, `SELECT granted FROM pgfence.try_acquire($1, 'taker', 60000000)`, name).Scan(&ok)
			if err == nil && !ok {
				err = errors.New("not granted")
			}
			granted <- err
		}()
	}
	pgtest.WaitFor(t, 30*time.Second, "both takeovers to wait for the fence lock", func() bool {
		var n int
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885824614 AND NOT granted
   AND waitstart < clock_timestamp() - interval '50 ms'
   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return err == nil && n == 2
	})

	rep, code := checkJSON(t, url, "--max-hold", "1h", "--max-wait", "10ms")
	if code != exitFindings || rep.OK || len(rep.BlockedTakeovers) != 2 {
		t.Fatalf("check: exit %d, %+v; want 4 and two blocked takeovers", code, rep)
	}
	frozenPID := int32(holders["frozen"].PgConn().PID())
	for _, b := range rep.BlockedTakeovers {
		switch {
		case b.Lease == "frozen" && b.ApplicationName == "taker-frozen" && len(b.HeldBy) == 1 && b.HeldBy[0] == frozenPID && len(b.Prepared) == 0:
		case b.Lease == "prepared" && b.ApplicationName == "taker-prepared" && len(b.HeldBy) == 0 && len(b.Prepared) == 1 && b.Prepared[0] == "xa-9":
		default:
			t.Errorf("blocked takeover %+v: want lease frozen held by pid %d, or lease prepared held by prepared transaction xa-9", b, frozenPID)
		}
		if b.WaitedSeconds < 0.01 || b.WaitStart.IsZero() {
			t.Errorf("blocked takeover %+v: waited less than --max-wait", b)
		}
	}
	if rep, _ := checkJSON(t, url, "--max-hold", "1h", "--max-wait", "1h"); len(rep.BlockedTakeovers) != 0 {
		t.Errorf("check --max-wait 1h: %+v, want no blocked takeover", rep.BlockedTakeovers)
	}
	r := db(t, url, "check", "--max-hold", "1h", "--max-wait", "10ms")
	if r.code != exitFindings || !strings.Contains(r.stdout, "2 lease takeovers waiting longer than 10ms") || !strings.Contains(r.stdout, `"xa-9"`) {
		t.Errorf("check (text): exit %d, stdout %q; want 4, the two takeovers and xa-9", r.code, r.stdout)
	}

	// Ended, the transactions let the takeovers through.
	exec(holders["frozen"], `ROLLBACK`)
	exec(admin, `ROLLBACK PREPARED 'xa-9'`)
	for range 2 {
		if err := <-granted; err != nil {
			t.Errorf("takeover after the holder's transaction ended: %v", err)
		}
	}
}
