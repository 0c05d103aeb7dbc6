package migrations_test

import (
	"context"
	"fmt"
	"io/fs"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// upTo applies migrations 1 to v to conn's database, as the migrations of
// that release would, bookkeeping included: migrations.Up then goes on
// from v.
func upTo(t *testing.T, ctx context.Context, conn *pgx.Conn, v int) {
	t.Helper()
	for i := 1; i <= v; i++ {
		names, err := fs.Glob(migrations.FS, fmt.Sprintf("%06d_*.up.sql", i))
		if err != nil || len(names) != 1 {
			t.Fatalf("migration %d: %v, %v", i, names, err)
		}
		sql, err := fs.ReadFile(migrations.FS, names[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("%s: %v", names[0], err)
		}
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE `+migrations.Table+` (version bigint NOT NULL PRIMARY KEY, dirty boolean NOT NULL);
INSERT INTO `+migrations.Table+` VALUES (`+strconv.Itoa(v)+`, false)`); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseTableLockWaitsBesideTraffic: migrations 5 and 7 alter
// pgfence.leases, and migration 9 re-keys the fence lock (a fenced
// transaction open when it runs holds the lock under the old key, which a
// takeover after the upgrade would not wait for): each takes
// pgfence.leases exclusively, and so waits until every open fenced
// transaction has ended. Lease traffic must not queue behind that wait,
// or leases would run out under their holders. Without migration 9's LOCK
// TABLE, Up returns while the writer is still open; without the bounded
// queueing of 5 and 7, the grant below waits for the writer and its 3 s
// run out.
func TestLeaseTableLockWaitsBesideTraffic(t *testing.T) {
	t.Parallel()
	for _, from := range []int{4, 6, 8} { // the next migration is 5, 7, 9
		t.Run(fmt.Sprintf("from %d", from), func(t *testing.T) {
			t.Parallel()
			upgradeBesideFencedWriter(t, from)
		})
	}
}

// upgradeBesideFencedWriter runs Up from version from, over a URL with
// settings (as a role's defaults), while a fenced transaction is open; with
// settings, it keeps the transaction open until the migration's own has
// run for 2 s.
func upgradeBesideFencedWriter(t *testing.T, from int, settings ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.EmptyURL(t)
	admin := connect(t, u)
	upTo(t, ctx, admin, from)
	if _, err := admin.Exec(ctx, `
CREATE TABLE accounts (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0);
SELECT pgfence.protect('accounts');`); err != nil {
		t.Fatal(err)
	}
	var fence int64
	if err := admin.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('job', 'me', 60000000) WHERE granted`).Scan(&fence); err != nil {
		t.Fatal(err)
	}

	writer := connect(t, u)
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pgfence.declare_token('job', $1)`, fence); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO accounts (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}

	up := make(chan error, 1)
	uu := u
	if len(settings) > 0 {
		uu = pgtest.WithSettings(u, settings...)
	}
	go func() { up <- migrations.Up(ctx, uu) }()
	// The migration queues for pgfence.leases behind the open writer.
	for waiting := false; !waiting; {
		select {
		case err := <-up:
			t.Fatalf("Up returned (%v) while a fenced transaction of version %d was open", err, from)
		case <-time.After(20 * time.Millisecond): // polling pg_locks: nothing to wait on
		}
		if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
			WHERE locktype = 'relation' AND relation = 'pgfence.leases'::regclass AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	// Lease traffic is not held up meanwhile: each attempt of the
	// migration queues for 100 ms at most (3 s is a generous bound for a
	// loaded machine).
	other := connect(t, u)
	actx, acancel := context.WithTimeout(ctx, 3*time.Second)
	defer acancel()
	var granted bool
	if err := other.QueryRow(actx, `SELECT granted FROM pgfence.try_acquire('other', 'me', 60000000)`).Scan(&granted); err != nil || !granted {
		t.Fatalf("a grant while migration %d waits for a fenced transaction: %v, %v", from+1, granted, err)
	}
	select {
	case err := <-up:
		t.Fatalf("Up returned (%v) while a fenced transaction of version %d was open", err, from)
	default:
	}
	if len(settings) > 0 {
		pgtest.WaitFor(t, 30*time.Second, "the migration's transaction to run for 2 s", func() bool {
			select {
			case err := <-up:
				t.Fatalf("Up returned (%v) while a fenced transaction of version %d was open", err, from)
			default:
			}
			var long bool
			if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE application_name = 'pgfence migrations' AND datname = current_database()
				  AND xact_start < clock_timestamp() - interval '2 seconds')`).Scan(&long); err != nil {
				t.Fatal(err)
			}
			return long
		})
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-up; err != nil {
		t.Fatalf("Up: %v", err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest(t) || dirty {
		t.Fatalf("Version = %d, %v, %v; want %d", v, dirty, err, latest(t))
	}
}
