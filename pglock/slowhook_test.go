package pglock

import (
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/internal/slogtest"
)

// A lost lock's Context ends before the loss is logged: a log handler
// that stalls must not keep a lock whose session is gone (and whose
// advisory lock another session may hold already) looking held. Over pgx
// the monitor finds the session gone; over database/sql its liveness
// query does.
func TestStalledLoggerStillEndsLostLock(t *testing.T) {
	t.Parallel()
	for _, driver := range []string{"pgx", "database/sql"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			h := slogtest.NewStalling("pglock: lock lost")
			pool := newPool(t, pgtest.URL(t), 4)
			var l *Locker
			if driver == "pgx" {
				l = newLocker(t, pool, WithLogger(slog.New(h)))
			} else {
				l = dbLockerWith(t, pool, WithLogger(slog.New(h)))
			}
			t.Cleanup(func() { h.Release() }) // before the pool closes
			watching := watchStarts(l)
			ctx := testContext(t)
			lk, err := l.Lock(ctx, "victim")
			if err != nil {
				t.Fatal(err)
			}
			if driver == "pgx" {
				awaitWatch(t, watching)
			}
			var ok bool
			if err := pool.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, int32(lk.pid)).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend = %v, %v", ok, err)
			}
			// Loss is noticed within about a second over pgx, within the
			// liveness interval + timeout (1s + 3s) over database/sql;
			// 15s leaves a loaded machine room.
			select {
			case <-lk.Done():
			case <-time.After(15 * time.Second):
				t.Fatal("the Lock's Context is still open 15s after its backend was terminated, while a log call stalls")
			}
			select {
			case <-h.Stalled(): // the loss was logged, after the Context ended
			case <-time.After(15 * time.Second):
				t.Error("the loss was not logged")
			}
		})
	}
}

// dbLockerWith is a Locker over database/sql, on pool's database, with opts.
func dbLockerWith(t *testing.T, pool *pgxpool.Pool, opts ...Option) *Locker {
	t.Helper()
	db := stdlib.OpenDB(*pool.Config().ConnConfig.Copy())
	t.Cleanup(func() { _ = db.Close() })
	l, err := NewDB(db, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
