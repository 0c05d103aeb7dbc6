package pglock

import (
	"errors"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A prepared transaction (two-phase commit) holds its transaction-level
// advisory locks with no session: pg_locks shows no pid. List and Get show
// such a lock with PID 0 and the transaction's GID, and a refused TryLock
// names it; before, List failed on the NULL pid (and with it `pgfence
// locks ls` and `pgfence check`), whoever had prepared the transaction.
func TestPreparedTransactionHolder(t *testing.T) {
	t.Parallel()
	c := pgtest.StartCluster(t, pgtest.WithSetting("max_prepared_transactions", "2"))
	pool := newPool(t, c.URL("postgres"), 4)
	l := newLocker(t, pool)
	ctx := testContext(t)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := XactLock(ctx, tx, "nightly"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `PREPARE TRANSACTION 'xa "1"'`); err != nil {
		t.Fatal(err)
	}
	// The session no longer holds anything; pgx ends its (now empty)
	// transaction.
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := pool.Exec(ctx, `ROLLBACK PREPARED 'xa "1"'`); err != nil {
			t.Error(err)
		}
	}()

	infos, err := l.List(ctx)
	if err != nil {
		t.Fatalf("List with a prepared transaction's lock: %v", err)
	}
	if len(infos) != 1 || infos[0].Key != Key("nightly") || !infos[0].Granted || infos[0].PID != 0 ||
		infos[0].GID != `xa "1"` || infos[0].Prepared.IsZero() {
		t.Fatalf("List = %+v, want the key of nightly granted to prepared transaction xa \"1\" (pid 0)", infos)
	}
	if got, err := l.Get(ctx, "nightly"); err != nil || len(got) != 1 || got[0].GID != `xa "1"` {
		t.Errorf("Get = %+v, %v; want the prepared transaction", got, err)
	}
	_, err = l.TryLock(ctx, "nightly")
	var he *HeldError
	if !errors.As(err, &he) || len(he.Holders) != 1 || he.Holders[0].GID != `xa "1"` || he.Holders[0].Prepared.IsZero() {
		t.Fatalf("TryLock behind a prepared transaction = %v (%+v), want a HeldError naming it", err, he)
	}
	if want := `held by prepared transaction "xa \"1\"" (prepared `; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}
}
