package leases_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
)

// A nightly job that every replica schedules: OnceTx runs it on one of
// them, and its writes commit in the transaction that records the period,
// so a crash before the commit leaves the period to the next replica.
func ExampleClient_OnceTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool, leases.WithOwner("billing-worker"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	period := "2026-12-01" // e.g. time.Now().UTC().Format(time.DateOnly)
	for range 2 {          // a second tick, or another replica, finds it done
		ran, err := client.OnceTx(ctx, "billing/nightly", period, 30*time.Second,
			func(ctx context.Context, tx pgx.Tx, l *leases.Lease) error {
				// Write the period's effects with tx: they commit with the record.
				fmt.Println("invoicing", period, "under", l.Name())
				return nil
			}, leases.AtLeast(5*time.Second))
		fmt.Println("ran:", ran, err)
	}
	// Output:
	// invoicing 2026-12-01 under billing/nightly
	// ran: true <nil>
	// ran: false <nil>
}

// A semaphore of 2: at most two exports run at once across all replicas.
// Each slot is a lease with its own fence, so Token works with package
// fencing as a lease's does.
func ExampleSemaphore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool, leases.WithOwner("exporter"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	sem, err := client.Semaphore("reports/export", 2)
	if err != nil {
		log.Fatal(err)
	}

	a, _ := sem.Acquire(ctx, time.Minute)
	b, _ := sem.Acquire(ctx, time.Minute)
	fmt.Println(a.Name(), b.Name())
	_, err = sem.TryAcquire(ctx, time.Minute)
	fmt.Println("third:", err != nil)
	_ = a.Release(ctx)
	c, _ := sem.TryAcquire(ctx, time.Minute)
	fmt.Println("after a release:", c.Slot(), c.Fence() > a.Fence())
	_ = b.Release(ctx)
	_ = c.Release(ctx)
	// Output:
	// reports/export#1 reports/export#2
	// third: true
	// after a release: 1 true
}
