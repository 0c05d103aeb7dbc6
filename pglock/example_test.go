package pglock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/pglock"
)

// Do runs a critical section under a lock: one process at a time, in this
// process and across every process using the same database.
func ExampleLocker_Do() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locker, err := pglock.New(pool)
	if err != nil {
		log.Fatal(err)
	}

	err = locker.Do(ctx, "billing/nightly-report", func(ctx context.Context, lk *pglock.Lock) error {
		// Only one process runs this at a time. ctx is cancelled, with
		// cause pglock.ErrLost, if the lock's session dies: stop then.
		fmt.Printf("holding %s\n", lk.Name())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("done")
	// Output:
	// holding billing/nightly-report
	// done
}

// TryLock takes a lock only if nobody holds it; the error then names the
// holder.
func ExampleLocker_TryLock() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locker, err := pglock.New(pool)
	if err != nil {
		log.Fatal(err)
	}

	lk, err := locker.TryLock(ctx, "migrations")
	if err != nil {
		log.Fatal(err)
	}
	defer lk.Unlock(context.WithoutCancel(ctx))

	// Another replica (here: the same process, on another session) tries.
	_, err = locker.TryLock(ctx, "migrations")
	var held *pglock.HeldError
	if errors.As(err, &held) {
		fmt.Println("another replica is migrating:", errors.Is(err, pglock.ErrLocked))
		for _, h := range held.Holders {
			fmt.Println("holder is idle:", h.State == "idle", "key matches:", h.Key == pglock.Key("migrations"))
		}
	}
	// Output:
	// another replica is migrating: true
	// holder is idle: true key matches: true
}

// LockAll takes several names at once, all or none: here the two accounts
// of a transfer, which other transfers name in the other order. They are
// taken in Key order whatever the order given, so two opposite transfers
// never deadlock.
func ExampleLocker_LockAll() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locker, err := pglock.New(pool)
	if err != nil {
		log.Fatal(err)
	}

	lk, err := locker.LockAll(ctx, "account/alice", "account/bob")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("holding", len(lk.Names()), "names")

	// The opposite transfer, on another session, finds one of them held.
	_, err = locker.TryLockAll(ctx, "account/bob", "account/alice")
	var held *pglock.HeldError
	fmt.Println("the other transfer is locked out:", errors.As(err, &held) && errors.Is(err, pglock.ErrLocked))

	if err := lk.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding 2 names
	// the other transfer is locked out: true
}

// XactLock serialises transactions on a name; the lock ends with the
// transaction.
func ExampleXactLock() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := pglock.XactLock(ctx, tx, "invoice/42"); err != nil {
			return err
		}
		// One transaction at a time gets here for invoice 42.
		_, err := tx.Exec(ctx, "SELECT 1")
		return err
	})
	fmt.Println("committed:", err == nil)
	// Output:
	// committed: true
}

func ExampleKey() {
	// The key an operator passes to pg_advisory_lock; the same as
	// SELECT pgfence.lock_key('billing').
	fmt.Println(pglock.Key("billing"))
	// Output:
	// 906850720199613079
}
