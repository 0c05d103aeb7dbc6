package leases

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestTakeoverWaitsPastTheRolesLockTimeout (scenario: a lease's grant has
// expired while its holder's fenced transaction stays open, and the
// taker's role sets lock_timeout, as many do to guard DDL). The takeover
// waits for the fence lock until that transaction ends, as long as its
// context allows. Acquire and TryAcquire returned "the session's
// lock_timeout ended the wait: ERROR: canceling statement due to lock
// timeout (SQLSTATE 55P03)" after 200ms instead (migration 19).
func TestTakeoverWaitsPastTheRolesLockTimeout(t *testing.T) {
	t.Parallel()
	for _, try := range []bool{false, true} {
		name := "Acquire"
		if try {
			name = "TryAcquire"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			u, pool, ctx := protectedWork(t)
			holder := namedConn(t, ctx, u, "holder")
			openExpiringFencedWrite(t, ctx, freeze(newClient(t, pool)), holder, 2*time.Second)
			pgtest.WaitFor(t, testTimeout, "the holder's grant to expire", func() bool {
				var expired bool
				err := pool.QueryRow(ctx, `SELECT expires_at <= clock_timestamp() FROM pgfence.leases WHERE name = 'job'`).Scan(&expired)
				return err == nil && expired
			})
			takerPool := pgtest.PoolFor(t, pgtest.WithSettings(u, "lock_timeout=200ms"))
			var lt string
			if err := takerPool.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil || lt != "200ms" {
				t.Fatalf("the taker's lock_timeout = %q, %v; want 200ms", lt, err)
			}
			taker := newClient(t, takerPool)
			took := make(chan error, 1)
			go func() {
				take := taker.Acquire
				if try {
					take = func(ctx context.Context, name string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
						return taker.TryAcquire(ctx, name, ttl, opts...)
					}
				}
				l, err := take(ctx, "job", time.Minute)
				if err == nil {
					err = l.Release(ctx)
				}
				took <- err
			}()
			// The takeover must still wait, well past its lock_timeout.
			pgtest.WaitFor(t, testTimeout, "the takeover to wait for the fence lock for a second", func() bool {
				select {
				case err := <-took:
					t.Fatalf("the takeover returned while the former holder's fenced transaction was open: %v", err)
				default:
				}
				var n int
				if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				   AND waitstart < clock_timestamp() - interval '1 second'
				   AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n > 0
			})
			if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
				t.Fatal(err)
			}
			if err := <-took; err != nil {
				t.Fatalf("the takeover: %v", err)
			}
		})
	}
}

// TestReadOnlyDefaultIsNamed: a role or database may set
// default_transaction_read_only = on, on a primary; a grant then fails
// with the SQLSTATE a standby raises (25006). The error said "connected to
// a standby", which sent the operator to look for a failover; it names
// the setting too.
func TestReadOnlyDefaultIsNamed(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	c := newClient(t, pgtest.PoolFor(t, pgtest.WithSettings(pgtest.URL(t), "default_transaction_read_only=on")))
	_, err := c.TryAcquire(ctx, "job", time.Minute)
	if pgerr.Code(err) != pgerr.ReadOnlySQLTransaction {
		t.Fatalf("TryAcquire in a read-only session: %v; want SQLSTATE 25006", err)
	}
	if !strings.Contains(err.Error(), "default_transaction_read_only") {
		t.Errorf("TryAcquire in a read-only session: %v; want the hint to name default_transaction_read_only", err)
	}
}

// TestRoleTimeoutsEndingATakeoverAreNamed (scenario: a lease's grant has
// expired while its holder's fenced transaction stays open, and the
// taker's role sets statement_timeout or, on PostgreSQL 17,
// transaction_timeout). The takeover waits for that transaction in one
// statement, which the setting ends whatever the caller's context allows
// (docs/production.md, "Session settings"): the call fails with the
// setting's SQLSTATE and a hint naming it, and grants nothing, then or
// once the holder commits.
func TestRoleTimeoutsEndingATakeoverAreNamed(t *testing.T) {
	t.Parallel()
	type timeoutCase struct{ setting, code, hint string }
	cases := []timeoutCase{{"statement_timeout=500ms", pgerr.QueryCanceled, "statement_timeout"}}
	if pgtest.HasSetting(t, "transaction_timeout") { // PostgreSQL 17 on
		cases = append(cases, timeoutCase{"transaction_timeout=500ms", pgerr.TransactionTimeout, "transaction_timeout"})
	}
	for _, c := range cases {
		for _, tk := range takes {
			for _, driver := range []string{"pgx", "database/sql"} {
				t.Run(c.setting+"/"+tk.name+"/"+driver, func(t *testing.T) {
					t.Parallel()
					url, admin, ctx, holder := expiredHolderWriting(t)
					taker := clientOver(t, driver, pgtest.WithSettings(url, c.setting), nil)
					l, err := tk.take(ctx, taker)
					if err == nil {
						t.Fatalf("%s granted %v behind an open fenced transaction", tk.name, l)
					}
					if pgerr.Code(err) != c.code {
						t.Fatalf("%s: %v; want SQLSTATE %s", tk.name, err, c.code)
					}
					if !strings.Contains(err.Error(), c.hint) {
						t.Errorf("%s: %v; want a hint naming %s", tk.name, err, c.hint)
					}
					if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
						t.Fatal(err)
					}
					pgtest.WaitFor(t, testTimeout, "no grant statement to run", func() bool { return grantRunning(t, ctx, admin, "") == 0 })
					if h := liveHolder(t, ctx, admin); h != "" {
						t.Errorf("the lease is held by %q after the takeover failed", h)
					}
				})
			}
		}
	}
}
