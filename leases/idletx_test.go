package leases

import (
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// A holder whose fenced transaction stays idle past its role's
// idle_in_transaction_session_timeout loses the session (the server ends
// it, which is what lets a takeover pass a frozen holder), and the error
// of its next statement names the setting: the server's own message says
// "idle-in-transaction timeout", which no setting is called.
func TestIdleInTransactionTimeoutHint(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	admin := pgtest.PoolFor(t, url)
	pool := pgtest.PoolFor(t, pgtest.WithSettings(url, "idle_in_transaction_session_timeout=200ms"))
	c := newClient(t, pool)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "idle", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release(ctx) }()
	tx, err := fencing.Begin(ctx, pool, l.Token())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	pid := tx.Conn().PgConn().PID()
	pgtest.WaitFor(t, testTimeout, "the server to end the idle transaction's session", func() bool {
		var gone bool
		if err := admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)`, int32(pid)).Scan(&gone); err != nil {
			t.Fatal(err)
		}
		return gone
	})
	_, err = MarkDone(ctx, tx, "idle", "p1")
	if pgerr.Code(err) != pgerr.IdleInTxTimeout || !strings.Contains(err.Error(), "idle_in_transaction_session_timeout") {
		t.Errorf("MarkDone after the session was ended: %v (SQLSTATE %q); want 25P03 and a hint naming idle_in_transaction_session_timeout", err, pgerr.Code(err))
	}
}
