package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
)

// Kleppmann's paused client, made harmless: A holds the "billing" lease and
// writes; A stalls, its lease is taken from it; B is granted the lease and
// writes; A wakes up and writes with its old token — and PostgreSQL rejects
// it.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// A protected table: a fence bigint column, then Protect (once, e.g.
	// in a migration: SELECT pgfence.protect('invoices')).
	if _, err := pool.Exec(ctx, `CREATE TABLE invoices (
		id     int PRIMARY KEY,
		status text NOT NULL,
		fence  bigint NOT NULL DEFAULT 0)`); err != nil {
		log.Fatal(err)
	}
	if err := fencing.Protect(ctx, pool, "invoices"); err != nil {
		log.Fatal(err)
	}
	setStatus := func(tok fencing.Token, status string) error {
		return fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO invoices (id, status) VALUES (1, $1)
				ON CONFLICT (id) DO UPDATE SET status = excluded.status`, status)
			return err
		})
	}

	client, err := leases.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	a, err := client.TryAcquire(ctx, "billing", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	stale := a.Token()
	fmt.Println("A writes:", setStatus(stale, "draft"))

	// A stalls (a long GC pause); its lease is taken away — here by the
	// operator's break-glass, just as well by expiry.
	if err := client.ForceRelease(ctx, "billing"); err != nil {
		log.Fatal(err)
	}
	err = client.Run(ctx, "billing", 10*time.Second, func(ctx context.Context, b *leases.Lease) error {
		fmt.Println("B writes:", setStatus(b.Token(), "sent"))
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	// A wakes up and carries on with its old token.
	err = setStatus(stale, "cancelled")
	fmt.Println("A's late write is stale:", errors.Is(err, fencing.ErrStale))

	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM invoices WHERE id = 1`).Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoice 1:", status)
	// Output:
	// A writes: <nil>
	// B writes: <nil>
	// A's late write is stale: true
	// invoice 1: sent
}

// Protect a table once, then write to it only inside InTx with the token of
// the lease the work runs under. A write whose token is no longer the
// lease's current grant is rejected: stop the work then.
func ExampleInTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (
		account text PRIMARY KEY,
		amount  bigint NOT NULL,
		fence   bigint NOT NULL DEFAULT 0)`); err != nil {
		log.Fatal(err)
	}
	if err := fencing.Protect(ctx, pool, "balances"); err != nil {
		log.Fatal(err)
	}

	client, err := leases.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	err = client.Run(ctx, "ledger/acme", 30*time.Second, func(ctx context.Context, l *leases.Lease) error {
		return fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO balances (account, amount) VALUES ('acme', 100)
				ON CONFLICT (account) DO UPDATE SET amount = excluded.amount`)
			return err
		})
	})
	switch {
	case errors.Is(err, fencing.ErrStale):
		fmt.Println("stale: another holder took over; stop")
	case err != nil:
		log.Fatal(err)
	default:
		fmt.Println("written under the lease")
	}
	// Output:
	// written under the lease
}
