package leases_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/leases"
)

// Run a job on exactly one of N replicas: every replica calls Run; one
// runs the job while the others wait (or use TryAcquire to skip).
func ExampleClient_Run() {
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

	err = client.Run(ctx, "billing/nightly-invoices", 30*time.Second, func(ctx context.Context, l *leases.Lease) error {
		// ctx ends if the lease is lost: check it before every effect, and
		// pass l.Token() with writes to fenced tables.
		fmt.Println("invoicing under lease", l.Name())
		return ctx.Err()
	})
	fmt.Println("done:", err)
	// Output:
	// invoicing under lease billing/nightly-invoices
	// done: <nil>
}

// TryAcquire does not wait: a held lease gives a *HeldError (matching
// ErrHeld) that names the holder.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	a, err := leases.New(pool, leases.WithOwner("replica-a"))
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := leases.New(pool, leases.WithOwner("replica-b"))
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	l, err := a.TryAcquire(ctx, "reports/export", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)

	_, err = b.TryAcquire(ctx, "reports/export", time.Minute)
	var held *leases.HeldError
	if errors.As(err, &held) {
		fmt.Println("held:", errors.Is(err, leases.ErrHeld), "same fence:", held.Holder.Fence == l.Fence())
	}
	// Output:
	// held: true same fence: true
}

// Lead elects one leader among replicas. fn runs while this replica leads;
// its context ends when leadership ends, and Lead campaigns again.
func ExampleClient_Lead() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool, leases.WithOwner("scheduler"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx, stop := context.WithCancel(context.Background())
	err = client.Lead(ctx, "scheduler/leader", 10*time.Second, func(ctx context.Context, l *leases.Lease) error {
		fmt.Println("leading")
		stop() // here: step down at once; a real leader works until ctx ends
		<-ctx.Done()
		return nil
	})
	fmt.Println("stepped down:", err)
	// Output:
	// leading
	// stepped down: <nil>
}

// A leader publishes its address with its lease (etcd's Proclaim); anyone
// reads it with Get, List or Observe, and only the current grant can
// change it.
func ExampleWithData() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool, leases.WithOwner("api-1"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	l, err := client.TryAcquire(ctx, "api/leader", 10*time.Second,
		leases.WithData(json.RawMessage(`{"addr": "10.0.0.1:8080"}`)))
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	info, _ := client.Get(ctx, "api/leader")
	fmt.Println("leader at", string(info.Data))

	// Moved: publish the new address (rejected if the grant is gone).
	if err := l.SetData(ctx, json.RawMessage(`{"addr": "10.0.0.1:9090"}`)); err != nil {
		log.Fatal(err)
	}
	info, _ = client.Get(ctx, "api/leader")
	fmt.Println("leader at", string(info.Data))
	// Output:
	// leader at {"addr": "10.0.0.1:8080"}
	// leader at {"addr": "10.0.0.1:9090"}
}

// A job that turns out to need longer extends its lease with a new TTL;
// the keepalive continues with it.
func ExampleLease_Extend() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := leases.New(pool)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	l, err := client.TryAcquire(ctx, "reports/rebuild", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer l.Release(ctx)
	if err := l.Extend(ctx, 5*time.Minute); err != nil {
		log.Fatal(err) // ErrLost: someone else may hold it now; stop
	}
	fmt.Println("ttl now", l.TTL())
	// Output:
	// ttl now 5m0s
}

// A rolling deploy asks the old leader to step down (River's
// RequestResign): its fn's context ends with cause ErrHandover, Lead
// releases once fn returns, and a waiting candidate takes over within a
// round trip. Operators do the same with `pgfence leases handover NAME`.
func ExampleClient_RequestHandover() {
	pool, err := pgxpool.New(context.Background(), os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	old, err := leases.New(pool, leases.WithOwner("pod-old"))
	if err != nil {
		log.Fatal(err)
	}
	defer old.Close()
	deployer, err := leases.New(pool, leases.WithOwner("deployer"))
	if err != nil {
		log.Fatal(err)
	}
	defer deployer.Close()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	leading := make(chan struct{})
	led := make(chan error, 1)
	go func() {
		led <- old.Lead(ctx, "deploy/leader", 10*time.Second, func(ctx context.Context, l *leases.Lease) error {
			close(leading)
			<-ctx.Done()
			fmt.Println("old leader: hand-over requested:", errors.Is(context.Cause(ctx), leases.ErrHandover))
			stop() // this pod is going away: do not campaign again
			return nil
		})
	}()
	<-leading
	_, err = deployer.RequestHandover(context.Background(), "deploy/leader", 10*time.Second)
	fmt.Println("handed over:", err == nil)
	fmt.Println("Lead returned:", <-led)
	// Output:
	// old leader: hand-over requested: true
	// handed over: true
	// Lead returned: <nil>
}
