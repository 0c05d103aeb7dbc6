package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// Kleppmann's paused client, made harmless: A holds the "billing" lease and
// writes; A stalls, its lease is taken from it; B is granted the lease and
// writes; A wakes up and writes with its old token — and PostgreSQL rejects
// it.
func Example() {
	ctx := context.Background()
	pool, done := pgtest.ExamplePool() // in your service: pgxpool.New(ctx, databaseURL)
	defer done()

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
