package pglock

import (
	"context"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestRoleTimeoutsEndingAWaitAreNamed: a role or database may set
// statement_timeout, lock_timeout or (PostgreSQL 17) transaction_timeout. A
// blocking Lock carries a deadline of ctx as its own lock_timeout, but the
// server's statement_timeout timer is armed before the statement runs, so a
// statement_timeout shorter than the wait ends it whatever ctx allows;
// without a deadline, the session's lock_timeout bounds the wait; a
// transaction_timeout shorter than the wait ends its whole session. Lock
// returned the server's bare "canceling statement due to statement
// timeout" (and "... lock timeout", "terminating connection due to
// transaction timeout"); it now says which setting did it (internal/pgerr's
// hints), over pgx and database/sql.
func TestRoleTimeoutsEndingAWaitAreNamed(t *testing.T) {
	t.Parallel()
	base := pgtest.URL(t)
	holderPool := newPool(t, base, 2)
	ctx := testContext(t)
	h, err := newLocker(t, holderPool).Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Unlock(context.Background()) })
	type timeoutCase struct {
		setting  string
		deadline bool // the waiter's context has one
		code     string
		hint     string
	}
	cases := []timeoutCase{
		{"statement_timeout=300ms", true, pgerr.QueryCanceled, "statement_timeout"},
		{"lock_timeout=200ms", false, pgerr.LockNotAvailable, "lock_timeout"},
	}
	if pgtest.HasSetting(t, "transaction_timeout") { // PostgreSQL 17 on
		cases = append(cases, timeoutCase{"transaction_timeout=300ms", true, pgerr.TransactionTimeout, "transaction_timeout"})
	}
	for _, c := range cases {
		for _, driver := range []string{"pgx", "database/sql"} {
			t.Run(c.setting+"/"+driver, func(t *testing.T) {
				t.Parallel()
				pool := newPool(t, pgtest.WithSettings(base, c.setting), 2)
				l := newLocker(t, pool)
				if driver == "database/sql" {
					l = dbLocker(t, pool)
				}
				// The waiter's own context: a parallel subtest may start
				// long after its parent's context was made.
				wctx := context.Background()
				if c.deadline {
					wctx = testContext(t)
				}
				lk, err := l.Lock(wctx, "held")
				if err == nil {
					_ = lk.Unlock(ctx)
					t.Fatal("Lock succeeded while another session held the lock")
				}
				if pgerr.Code(err) != c.code {
					t.Fatalf("Lock: %v; want SQLSTATE %s", err, c.code)
				}
				if !strings.Contains(err.Error(), c.hint) {
					t.Errorf("Lock: %v; want a hint naming %s", err, c.hint)
				}
			})
		}
	}
}
