package leases

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A grant whose answer the client cannot read: pgx's exec mode reads
// timestamps as text, which it parses only in DateStyle ISO, and a role
// here defaults to 'SQL, DMY'. The server commits the grant; the call
// fails. Before, the grant stayed live, held by an owner nobody knew,
// until its TTL: nobody — this client included — could take the lease
// for a minute. Now the failed call ends it (by its owner, drawn for that
// attempt), for a lease and for a semaphore's slot.
func TestGrantWhoseAnswerIsNotReadIsEnded(t *testing.T) {
	t.Parallel()
	base := pgtest.URL(t)
	odd := pgtest.PoolFor(t, pgtest.WithSettings(base, "DateStyle=SQL,DMY"), func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec })
	c := newClient(t, odd)
	admin := pgtest.PoolFor(t, base)
	ctx := testContext(t)
	live := func(pattern string) int {
		t.Helper()
		var n int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE name LIKE $1 AND expires_at > clock_timestamp()`, pattern).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	l, err := c.TryAcquire(ctx, "unread", time.Minute)
	if err == nil {
		t.Fatalf("TryAcquire over exec mode with DateStyle SQL = %v, nil; want the decode error (the premise of this test)", l)
	}
	if n := live("unread"); n != 0 {
		t.Errorf("%d live grants of \"unread\" after the grant whose answer could not be read; want 0", n)
	}
	s, err := c.Semaphore("unread-sem", 2)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.TryAcquire(ctx, time.Minute); err == nil {
		t.Fatalf("Semaphore.TryAcquire over exec mode with DateStyle SQL = %v, nil; want the decode error", l)
	}
	if n := live("unread-sem#%"); n != 0 {
		t.Errorf("%d live slots of \"unread-sem\" after the grant whose answer could not be read; want 0", n)
	}
	// Anyone can take it now.
	if _, err := newClient(t, admin).TryAcquire(ctx, "unread", time.Minute); err != nil {
		t.Errorf("TryAcquire by a client that reads its answers: %v", err)
	}
}
