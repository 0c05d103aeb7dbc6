package integration_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// TestPgBouncerStatementPooling (scenario: an operator puts pgfence behind
// PgBouncer in statement pooling, where each statement may run on another
// server session and no transaction may span two statements). Leases need
// single statements only, and work: grant, ErrHeld, the keepalive past the
// TTL, release, hand-over by polling. What needs a transaction fails, with
// PgBouncer's error, and commits nothing: a fenced write, OnceTx (before
// its fn), Once's record (after its fn: Once reports the period not done).
// Session locks fail as in transaction pooling: here another client takes
// the lock's server session right after the grant, and Lock returns
// ErrPooler and no Lock.
func TestPgBouncerStatementPooling(t *testing.T) {
	t.Parallel()
	u := setup(t)
	bu := bouncer(t, u, pgtest.StatementPooling, pgtest.WithBouncerSetting("default_pool_size", "2"))
	direct := newPool(t, u, "pgb-direct")
	protectedTable(t, direct, "account", "id int PRIMARY KEY, balance int NOT NULL")
	ctx := ctxT(t, 2*time.Minute)
	pool := newPool(t, bu, "pgb-stmt")
	logs := newLogRecorder()
	a := newLeases(t, pool, "a")
	b := newLeases(t, newPool(t, bu, "pgb-stmt-b"), "b",
		leases.WithLogger(logs.logger()), leases.WithPollInterval(200*time.Millisecond))

	t.Run("leases", func(t *testing.T) {
		const ttl = 3 * time.Second // as TestPgBouncerTransactionLeases
		la, err := a.TryAcquire(ctx, "job", ttl)
		if err != nil {
			t.Fatalf("TryAcquire through statement pooling: %v", err)
		}
		if _, err := b.TryAcquire(ctx, "job", ttl); !errors.Is(err, leases.ErrHeld) {
			t.Fatalf("TryAcquire of a held lease: %v, want ErrHeld", err)
		}
		mustRenewPastExpiry(t, ctx, direct, la)
		got := make(chan error, 1)
		go func() {
			lb, err := b.Acquire(ctx, "job", ttl)
			if err == nil {
				err = lb.Release(ctx)
			}
			got <- err
		}()
		logs.await(t, 20*time.Second, "saying notifications do not reach the client", fallbackLogged)
		if err := la.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("Acquire, then Release, after the holder released: %v", err)
			}
		case <-time.After(30 * time.Second): // polling at 200ms; a loaded machine
			t.Fatal("Acquire was not granted after the holder released")
		}
	})

	t.Run("transactions", func(t *testing.T) {
		l, err := a.TryAcquire(ctx, "account", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(context.Background())
		err = fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO account VALUES (1, 100)")
			return err
		})
		mustName := func(what string, err error) {
			t.Helper()
			if err == nil || !strings.Contains(err.Error(), "statement pooling") {
				t.Errorf("%s through statement pooling: %v; want PgBouncer's error naming statement pooling", what, err)
			}
		}
		mustName("fencing.InTx", err)
		// A first statement with arguments rides in one batch with BEGIN.
		err = fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO account VALUES ($1, $2)", 1, 100)
			return err
		})
		mustName("fencing.InTx, its first statement in the batch", err)
		ranTx := false
		done, err := a.OnceTx(ctx, "report", "p1", time.Minute, func(context.Context, pgx.Tx, *leases.Lease) error { ranTx = true; return nil })
		mustName("OnceTx", err)
		if done || ranTx {
			t.Errorf("OnceTx: done %v, fn ran %v; want neither", done, ranTx)
		}
		ran := false
		done, err = a.Once(ctx, "report", "p2", time.Minute, func(context.Context, *leases.Lease) error { ran = true; return nil })
		mustName("Once's record", err)
		if done || !ran {
			t.Errorf("Once: done %v, fn ran %v; want fn run and the period not done", done, ran)
		}
		var rows, periods int
		if err := direct.QueryRow(ctx, `SELECT (SELECT count(*) FROM account), (SELECT count(*) FROM pgfence.once)`).Scan(&rows, &periods); err != nil {
			t.Fatal(err)
		}
		if rows != 0 || periods != 0 {
			t.Errorf("%d rows written and %d periods recorded through statement pooling; want none", rows, periods)
		}
	})

	t.Run("session locks", func(t *testing.T) {
		other, err := pgx.Connect(ctx, bu)
		if err != nil {
			t.Fatalf("connect the other client: %v", err)
		}
		defer other.Close(context.Background())
		var (
			once  sync.Once
			slept = make(chan error, 1)
		)
		// Right after the grant, the other client runs a statement that
		// takes the server session the grant ran on (PgBouncer hands out
		// the most recently released first) for a second; pglock's check
		// then runs on the other server session.
		tracer := &advisoryLockTracer{onLocked: func() {
			once.Do(func() {
				go func() {
					_, err := other.Exec(ctx, "SELECT pg_sleep(1)")
					slept <- err
				}()
				mustWait(t, 10*time.Second, "the other client's statement to run", func() (bool, error) {
					var n int
					err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND state = 'active' AND query = 'SELECT pg_sleep(1)'`).Scan(&n)
					return n == 1, err
				})
			})
		}}
		locker := newLocker(t, newPool(t, bu, "pgb-stmt-lock", func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer }))
		lk, err := locker.Lock(ctx, "session")
		if !errors.Is(err, pglock.ErrPooler) || lk != nil {
			t.Errorf("Lock through statement pooling: %v, %v; want ErrPooler and no Lock", lk, err)
		}
		if lk != nil {
			_ = lk.Unlock(ctx)
		}
		if err := <-slept; err != nil {
			t.Fatalf("the other client's statement: %v", err)
		}
		// The lock stays with the server session the grant ran on, idle in
		// PgBouncer's pool: end it, as the ErrPooler doc says.
		if _, err := direct.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
  WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
			t.Fatal(err)
		}
	})
}
