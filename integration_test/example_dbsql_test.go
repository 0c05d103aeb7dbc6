package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"log"
	"os"
	"time"

	"github.com/jmoiron/sqlx"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// A GORM application: gorm.DB gives its *sql.DB to pglock and leases, and
// a fenced write runs in GORM's own transaction once it has declared the
// lease's token (the statement fencing.BeginDB runs).
func Example_gorm() {
	ctx := context.Background()
	gdb, err := gorm.Open(postgres.Open(os.Getenv("DATABASE_URL")), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	db, err := gdb.DB() // the *sql.DB under GORM
	if err != nil {
		log.Fatal(err)
	}

	// A session lock: one replica at a time rebuilds the cache.
	locker, err := pglock.NewDB(db)
	if err != nil {
		log.Fatal(err)
	}
	err = locker.Do(ctx, "cache/rebuild", func(ctx context.Context, _ *pglock.Lock) error {
		return gdb.WithContext(ctx).Exec("REFRESH MATERIALIZED VIEW report").Error
	})
	if err != nil {
		log.Print(err)
	}

	// A lease, and writes fenced by its token.
	client, err := leases.NewDB(db)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lease, err := client.Acquire(ctx, "billing", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	tok := lease.Token()
	err = gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// Declare the token first: every write of the transaction is
		// then checked by the guard (fencing.BeginDB does the same).
		if err := tx.Exec("CALL pgfence.declare(?, ?)", tok.Lease, tok.Fence).Error; err != nil {
			return err
		}
		return tx.Exec("UPDATE accounts SET balance = balance - ? WHERE id = ?", 10, 1).Error
	})
	if fencing.IsStale(err) {
		log.Print("lost the lease: stop") // a newer holder exists
	}
}

// An sqlx application: *sqlx.DB embeds the *sql.DB, and sqlx's BeginTxx
// is not needed: fencing.InDBTx gives a *sql.Tx, which sqlx can wrap.
func Example_sqlx() {
	ctx := context.Background()
	xdb, err := sqlx.Open("postgres", os.Getenv("DATABASE_URL")) // lib/pq
	if err != nil {
		log.Fatal(err)
	}
	defer xdb.Close()

	locker, err := pglock.NewDB(xdb.DB)
	if err != nil {
		log.Fatal(err)
	}
	lk, err := locker.TryLock(ctx, "migrations")
	if errors.Is(err, pglock.ErrLocked) {
		return // another replica migrates
	} else if err != nil {
		log.Fatal(err)
	}
	defer lk.Unlock(context.Background())

	client, err := leases.NewDB(xdb.DB)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	lease, err := client.TryAcquire(ctx, "report", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.Background())
	err = fencing.InDBTx(ctx, xdb, lease.Token(), func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, xdb.Rebind("UPDATE reports SET done = true WHERE id = ?"), 7)
		return err
	})
	if fencing.IsStale(err) {
		log.Print("lost the lease: stop")
	}
}
