package leases

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// preparedCluster is protectedWork on a throwaway cluster of the test's
// own that allows prepared transactions (max_prepared_transactions is 0 by
// default, and a server setting), with the cluster, for a test that kills
// the server.
func preparedCluster(t *testing.T) (*pgtest.Cluster, string, *pgxpool.Pool, context.Context) {
	t.Helper()
	c := pgtest.StartCluster(t, pgtest.WithSetting("max_prepared_transactions", "2"))
	url := c.URL("postgres")
	ctx := testContext(t)
	if err := migrations.Up(ctx, url); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolFor(t, url)
	if _, err := pool.Exec(ctx, `CREATE TABLE work (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0); SELECT pgfence.protect('work')`); err != nil {
		t.Fatal(err)
	}
	return c, url, pool, ctx
}

// prepareFencedWrite writes a row of "work" under l's token on conn and
// prepares the transaction as gid: from then on no backend holds l's fence
// lock, the prepared transaction does.
func prepareFencedWrite(t *testing.T, ctx context.Context, conn *pgxpool.Conn, l *Lease, gid string) {
	t.Helper()
	openFencedWrite(t, ctx, conn, l)
	prepare(t, ctx, conn, gid)
}

// prepare prepares conn's open transaction as gid.
func prepare(t *testing.T, ctx context.Context, conn *pgxpool.Conn, gid string) {
	t.Helper()
	if _, err := conn.Exec(ctx, `PREPARE TRANSACTION '`+strings.ReplaceAll(gid, `'`, `''`)+`'`); err != nil {
		t.Fatalf("PREPARE TRANSACTION: %v", err)
	}
}

// grantAndPrepare grants "job" to c for ttl and prepares a fenced write
// under it on conn as gid, as prepareFencedWrite does. The grant is short, so
// that it expires with the transaction prepared, and under REPEATABLE READ
// the transaction share-locks the lease row, so the grant cannot be
// shortened after the write (openExpiringFencedWrite): if it expires
// before the write on a loaded machine (PF001), it grants again, up to
// five times.
func grantAndPrepare(t *testing.T, ctx context.Context, c *Client, conn *pgxpool.Conn, ttl time.Duration, gid string) *Lease {
	t.Helper()
	for attempt := 1; ; attempt++ {
		l, err := c.TryAcquire(ctx, "job", ttl)
		if err != nil {
			t.Fatal(err)
		}
		err = fencedWrite(ctx, conn, l)
		if err == nil {
			prepare(t, ctx, conn, gid)
			return l
		}
		if dbx.SQLState(err) != fencing.SQLStateStale || attempt == 5 {
			t.Fatal(err)
		}
		t.Logf("grant %d expired before its write: %v", attempt, err)
		pgtest.WaitFor(t, testTimeout, "the expired grant to be free", func() bool { return !c.holdsLocally("job") })
	}
}

// TestForceReleaseBehindPreparedTransaction (scenario: a two-phase commit
// coordinator died between PREPARE and COMMIT PREPARED, after a fenced
// write). The prepared transaction holds the lease's fence lock with no
// backend, so pg_blocking_pids shows pid 0 and terminating backends does
// nothing. ForceRelease's BlockedError names the prepared transaction
// instead of nobody; once it is rolled back the release succeeds and the
// write is gone.
func TestForceReleaseBehindPreparedTransaction(t *testing.T) {
	t.Parallel()
	_, url, pool, ctx := preparedCluster(t)
	holder := newClient(t, pool)
	// A short TTL: the holder learns of the force-release at its next
	// renewal, a third of the TTL later.
	l, err := holder.TryAcquire(ctx, "job", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const gid = `coordinator 'tx-1'` // quoted in SQL, %q in the error
	prepareFencedWrite(t, ctx, namedConn(t, ctx, url, "coordinator"), l, gid)
	var role string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}

	admin := newClient(t, pool, WithForceReleaseTimeout(300*time.Millisecond))
	err = admin.ForceRelease(ctx, "job")
	var be *BlockedError
	if !errors.Is(err, ErrBlocked) || !errors.As(err, &be) {
		t.Fatalf("ForceRelease behind a prepared transaction = %v, want a *BlockedError", err)
	}
	if len(be.Blockers) != 0 {
		t.Errorf("blockers = %+v, want none: no backend holds the lock (the coordinator's session is idle)", be.Blockers)
	}
	if len(be.Prepared) != 1 || be.Prepared[0].GID != gid || be.Prepared[0].Owner != role || be.Prepared[0].Prepared.IsZero() {
		t.Fatalf("prepared = %+v, want the transaction %q of %s with its time", be.Prepared, gid, role)
	}
	if want := `lease locked by prepared transaction "coordinator 'tx-1'" (owner "` + role + `", prepared `; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not contain %q", err, want)
	}

	if _, err := pool.Exec(ctx, `ROLLBACK PREPARED 'coordinator ''tx-1'''`); err != nil {
		t.Fatal(err)
	}
	if err := admin.ForceRelease(ctx, "job"); err != nil {
		t.Fatalf("ForceRelease after ROLLBACK PREPARED: %v", err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("force-released holder never learned of it")
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM work`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d rows in work after ROLLBACK PREPARED, want 0", n)
	}
}

// TestPreparedFencedWriteHoldsOffTakeover (scenario: a holder prepares a
// fenced write, stops renewing, and its lease expires before COMMIT
// PREPARED comes; in the "crash" cases the server also crashes and
// restarts in the meantime, and under REPEATABLE READ the transaction also
// share-locks the lease row). The prepared transaction still holds the
// fence lock — recovery restores its locks — so the takeover waits for it,
// and the write commits before the next grant: with the old fence, which
// the new holder's writes then supersede. A takeover that went ahead would
// let the old write land after the new grant.
func TestPreparedFencedWriteHoldsOffTakeover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		crash     bool
		isolation string
	}{
		{"running", false, "read committed"},
		{"crash", true, "read committed"},
		{"repeatable read crash", true, "repeatable read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, url, pool, ctx := preparedCluster(t)
			frozen := freeze(newClient(t, pool))
			coordinator := namedConn(t, ctx, url, "coordinator")
			if _, err := coordinator.Exec(ctx, `SELECT set_config('default_transaction_isolation', $1, false)`, tc.isolation); err != nil {
				t.Fatal(err)
			}
			old := grantAndPrepare(t, ctx, frozen, coordinator, time.Second, "tx-2")
			if tc.crash {
				if err := c.Kill(); err != nil {
					t.Fatal(err)
				}
				if err := c.Start(); err != nil {
					t.Fatal(err)
				}
				// A pool of the restarted server's: the old one's
				// connections died.
				pool = pgtest.PoolFor(t, url)
				var gids []string
				if err := pool.QueryRow(ctx, `SELECT array_agg(gid) FROM pg_prepared_xacts`).Scan(&gids); err != nil {
					t.Fatal(err)
				}
				if len(gids) != 1 || gids[0] != "tx-2" {
					t.Fatalf("prepared transactions after the crash: %q, want [tx-2]", gids)
				}
			}
			next := newClient(t, pool)
			got := make(chan *Lease, 1)
			failed := make(chan error, 1)
			go func() {
				l, err := next.Acquire(ctx, "job", time.Minute)
				if err != nil {
					failed <- err
					return
				}
				got <- l
			}()
			// The grant has expired by the database clock and the
			// takeover waits for the fence lock (try_acquire's slow path).
			pgtest.WaitFor(t, 30*time.Second, "the takeover to wait for the prepared transaction", func() bool {
				var waiting bool
				err := pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT FROM pgfence.leases WHERE name = 'job' AND expires_at > clock_timestamp())
   AND EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND classid = 1885824614 AND NOT granted)`).Scan(&waiting)
				return err == nil && waiting
			})
			select {
			case l := <-got:
				t.Fatalf("granted fence %d while a prepared fenced write of fence %d was undecided", l.Fence(), old.Fence())
			case err := <-failed:
				t.Fatal(err)
			default:
			}

			if _, err := pool.Exec(ctx, `COMMIT PREPARED 'tx-2'`); err != nil {
				t.Fatal(err)
			}
			var l *Lease
			select {
			case l = <-got:
			case err := <-failed:
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatal("no grant after COMMIT PREPARED")
			}
			if l.Fence() <= old.Fence() {
				t.Fatalf("new fence %d not above the prepared write's %d", l.Fence(), old.Fence())
			}
			var stored int64
			if err := pool.QueryRow(ctx, `SELECT fence FROM work WHERE id = 1`).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if stored != old.Fence() {
				t.Errorf("the prepared write stored fence %d, want %d", stored, old.Fence())
			}
			// The old token is stale now; the new one writes over the
			// old row.
			stale := namedConn(t, ctx, url, "stale")
			if _, err := stale.Exec(ctx, `BEGIN; SELECT pgfence.declare_token('job', `+itoa(old.Fence())+`); UPDATE work SET id = 1; COMMIT`); pgerr.Code(err) != "PF001" {
				t.Errorf("write with the old token after the takeover = %v, want SQLSTATE PF001 (stale)", err)
			}
			if _, err := pool.Exec(ctx, `BEGIN; SELECT pgfence.declare_token('job', `+itoa(l.Fence())+`); UPDATE work SET id = 1; COMMIT`); err != nil {
				t.Errorf("write with the new token: %v", err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
