package leases_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// Run a job on exactly one of N replicas: every replica calls Run; one
// runs the job while the others wait (or use TryAcquire to skip).
func ExampleClient_Run() {
	pool, done := pgtest.ExamplePool() // your *pgxpool.Pool
	defer done()
	client, err := leases.New(pool, leases.WithOwner("billing-worker"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx := context.Background()
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

// TryAcquire does not wait: a held lease gives ErrHeld, naming the holder.
func ExampleClient_TryAcquire() {
	pool, done := pgtest.ExamplePool()
	defer done()
	a, _ := leases.New(pool, leases.WithOwner("replica-a"))
	defer a.Close()
	b, _ := leases.New(pool, leases.WithOwner("replica-b"))
	defer b.Close()

	ctx := context.Background()
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
	pool, done := pgtest.ExamplePool()
	defer done()
	client, _ := leases.New(pool, leases.WithOwner("scheduler"))
	defer client.Close()

	ctx, stop := context.WithCancel(context.Background())
	err := client.Lead(ctx, "scheduler/leader", 10*time.Second, func(ctx context.Context, l *leases.Lease) error {
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
	pool, done := pgtest.ExamplePool()
	defer done()
	client, _ := leases.New(pool, leases.WithOwner("api-1"))
	defer client.Close()

	ctx := context.Background()
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
	pool, done := pgtest.ExamplePool()
	defer done()
	client, _ := leases.New(pool)
	defer client.Close()

	ctx := context.Background()
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
	pool, done := pgtest.ExamplePool()
	defer done()
	old, _ := leases.New(pool, leases.WithOwner("pod-old"))
	defer old.Close()
	deployer, _ := leases.New(pool, leases.WithOwner("deployer"))
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
	_, err := deployer.RequestHandover(context.Background(), "deploy/leader", 10*time.Second)
	fmt.Println("handed over:", err == nil)
	fmt.Println("Lead returned:", <-led)
	// Output:
	// old leader: hand-over requested: true
	// handed over: true
	// Lead returned: <nil>
}
