package pglock

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// connect opens one connection to u, closed when t ends.
func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect %s: %v", u, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// behindBouncer returns the URL of u's database through a PgBouncer in
// mode with two server connections per pool, in pgx's exec query mode (no
// named prepared statements, which PgBouncer 1.18 cannot pool).
func behindBouncer(t *testing.T, u string, mode pgcluster.PoolMode) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatalf("parse %s: %v", u, err)
	}
	b := pgtest.StartPgBouncer(t, u, mode, pgtest.WithBouncerSetting("default_pool_size", "2"))
	return b.URL(cfg.Database) + "&default_query_exec_mode=exec"
}

// holders returns the pids of the backends of conn's database holding the
// session advisory lock key in the given mode.
func holders(t *testing.T, conn *pgx.Conn, key int64, mode string) []int32 {
	t.Helper()
	rows, err := conn.Query(testContext(t), `SELECT pid FROM pg_locks
	  WHERE locktype = 'advisory' AND`+inThisDB+`AND granted AND mode = $3
	    AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1 ORDER BY pid`,
		int64(uint64(key)>>32), int64(uint32(key)), mode)
	if err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatalf("pg_locks: %v", err)
	}
	return pids
}

func TestVerifySessionDirect(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	ctx := testContext(t)
	conn, other := connect(t, u), connect(t, u)
	for _, k := range []struct {
		name string
		key  int64
	}{{"positive key", Key("pooler/a")}, {"negative key", -Key("pooler/a")}, {"high bit only", -1 << 63}} {
		t.Run(k.name, func(t *testing.T) {
			key := k.key
			if err := verifySession(ctx, conn, key, false); !errors.Is(err, ErrPooler) {
				t.Fatalf("verify a lock nobody holds: %v, want ErrPooler", err)
			}
			mustExec(t, conn, sqlLock, key, nil)
			if err := verifySession(ctx, conn, key, false); err != nil {
				t.Errorf("verify exclusive lock held by this session: %v", err)
			}
			if err := verifySession(ctx, conn, key, true); !errors.Is(err, ErrPooler) {
				t.Errorf("verify shared while holding exclusive: %v, want ErrPooler", err)
			}
			if err := verifySession(ctx, other, key, false); !errors.Is(err, ErrPooler) {
				t.Errorf("verify from a session that does not hold it: %v, want ErrPooler", err)
			}
			mustExec(t, conn, sqlUnlock, key)
			mustExec(t, conn, sqlLockShared, key, nil)
			mustExec(t, other, sqlLockShared, key, nil)
			for _, c := range []*pgx.Conn{conn, other} {
				if err := verifySession(ctx, c, key, true); err != nil {
					t.Errorf("verify a shared lock held by this session and another: %v", err)
				}
			}
			if err := verifySession(ctx, conn, key, false); !errors.Is(err, ErrPooler) {
				t.Errorf("verify exclusive while holding shared: %v, want ErrPooler", err)
			}
			mustExec(t, conn, sqlUnlockShared, key)
			mustExec(t, other, sqlUnlockShared, key)
		})
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := verifySession(cctx, conn, 1, false); err == nil || errors.Is(err, ErrPooler) || !errors.Is(err, context.Canceled) {
		t.Errorf("verify with a cancelled context: %v, want context.Canceled and not ErrPooler", err)
	}
}

// TestVerifySessionTransactionPooler: the lock statement runs on one server
// session of a transaction-mode PgBouncer; another client is then handed
// that session (PgBouncer reuses the most recently released one first), so
// the check runs on a second server session and reports ErrPooler. The
// lock stays with the first server session: only the client handed it can
// release it.
func TestVerifySessionTransactionPooler(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	bu := behindBouncer(t, u, pgcluster.TransactionPooling)
	ctx := testContext(t)
	direct, a, b := connect(t, u), connect(t, bu), connect(t, bu)
	key := Key("pooler/transaction")

	mustExec(t, a, sqlLock, key, nil)
	held := holders(t, direct, key, "ExclusiveLock")
	if len(held) != 1 {
		t.Fatalf("lock holders after pg_advisory_lock through PgBouncer: %v, want one", held)
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		t.Fatalf("begin on the second client: %v", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var bpid int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&bpid); err != nil {
		t.Fatalf("second client's backend: %v", err)
	}
	if bpid != held[0] {
		t.Fatalf("precondition: PgBouncer handed the second client backend %d, not %d that took the lock (server_round_robin=0 reuses the last released first)", bpid, held[0])
	}

	err = verifySession(ctx, a, key, false)
	if !errors.Is(err, ErrPooler) {
		t.Fatalf("verify through a transaction pooler: %v, want ErrPooler", err)
	}
	t.Logf("detected: %v", err)
	if got := holders(t, direct, key, "ExclusiveLock"); len(got) != 1 || got[0] != held[0] {
		t.Errorf("after detection the lock is held by %v, want still by %d (left behind on the server session)", got, held[0])
	}
	// The client that was handed the server session can release it.
	var ok bool
	if err := tx.QueryRow(ctx, sqlUnlock, key).Scan(&ok); err != nil || !ok {
		t.Fatalf("unlock from the session holding it: %v, %v", ok, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if got := holders(t, direct, key, "ExclusiveLock"); len(got) != 0 {
		t.Errorf("lock still held by %v after unlock", got)
	}
}

// TestVerifySessionSessionPooler: in session mode each client keeps its
// server session, so the check passes even while another client is busy.
func TestVerifySessionSessionPooler(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	bu := behindBouncer(t, u, pgcluster.SessionPooling)
	ctx := testContext(t)
	a, b := connect(t, bu), connect(t, bu)
	key := Key("pooler/session")
	for _, shared := range []bool{false, true} {
		lock, unlock := sqlLock, sqlUnlock
		if shared {
			lock, unlock = sqlLockShared, sqlUnlockShared
		}
		mustExec(t, a, lock, key, nil)
		tx, err := b.Begin(ctx)
		if err != nil {
			t.Fatalf("begin on the second client: %v", err)
		}
		if err := verifySession(ctx, a, key, shared); err != nil {
			t.Errorf("verify (shared %v) through a session pooler: %v", shared, err)
		}
		_ = tx.Rollback(ctx)
		var ok bool
		if err := a.QueryRow(ctx, unlock, key).Scan(&ok); err != nil || !ok {
			t.Fatalf("unlock: %v, %v", ok, err)
		}
	}
}

func mustExec(t *testing.T, conn *pgx.Conn, sql string, args ...any) {
	t.Helper()
	if _, err := conn.Exec(testContext(t), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestTryLockAllRefusedBehindTransactionPooler (scenario: a TryLockAll
// through PgBouncer in transaction mode takes the first name of a set,
// then finds the second held). The names taken before the refused one must
// be given back on the server session that took them; a give-back sent as
// a statement of its own went, with round-robin server connections, to
// another server session, and the first name stayed held by a session the
// pooler hands to other clients.
func TestTryLockAllRefusedBehindTransactionPooler(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	b := pgtest.StartPgBouncer(t, u, pgcluster.TransactionPooling,
		pgtest.WithBouncerSetting("default_pool_size", "3"),
		pgtest.WithBouncerSetting("server_round_robin", "1"))
	bu := b.URL(cfg.Database) + "&default_query_exec_mode=exec"
	ctx := testContext(t)
	// Three server sessions in PgBouncer's pool, each statement of one
	// client going to the next.
	var txs []pgx.Tx
	for range 3 {
		tx, err := connect(t, bu).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			t.Fatal(err)
		}
		txs = append(txs, tx)
	}
	for _, tx := range txs {
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	direct := newPool(t, u, 4)
	names := byKey("pooled-a", "pooled-b")
	holder, err := newLocker(t, direct).Lock(ctx, names[1])
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Unlock(ctx) }()

	l := newLocker(t, pgtest.PoolFor(t, bu, func(c *pgxpool.Config) { c.MaxConns = 1 }))
	_, err = l.TryLockAll(ctx, names...)
	var herr *HeldError
	if !errors.As(err, &herr) || herr.Name != names[1] {
		t.Fatalf("TryLockAll = %v, want a *HeldError for %q", err, names[1])
	}
	if pids := holders(t, connect(t, u), Key(names[0]), "ExclusiveLock"); len(pids) != 0 {
		t.Errorf("after the refused TryLockAll, %q is still held by server session(s) %v", names[0], pids)
	}
}
