package integration_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// workerRoles are the bodies a worker process can run. Each returns when
// its work is done or its stdin ends; an error is reported to the parent as
// an "error" event.
var workerRoles = map[string]func(ctx context.Context, wk *workerSide) error{
	"periods": rolePeriods,
	"lease":   roleLease,
	"lock":    roleLock,
	"linear":  roleLinear,
}

func isStale(err error) bool { return fencing.IsStale(err) }
func isLeaseLost(err error) bool {
	return errors.Is(err, leases.ErrLost) || errors.Is(err, pglock.ErrLost)
}
func isHeld(err error) bool   { return errors.Is(err, leases.ErrHeld) }
func isLocked(err error) bool { return errors.Is(err, pglock.ErrLocked) }

// workerLeases opens the worker's pool and a leases client owned by the
// worker's id; closeAll closes the client, then the pool.
func workerLeases(ctx context.Context, wk *workerSide) (pool *pgxpool.Pool, client *leases.Client, closeAll func(), err error) {
	pool, err = workerPool(ctx, wk)
	if err != nil {
		return nil, nil, nil, err
	}
	client, err = leases.New(pool, leases.WithOwner(wk.cfg.ID))
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return pool, client, func() { _ = client.Close(); pool.Close() }, nil
}

// workerPool opens the worker's pool; application_name is the worker's id,
// so the parent can find its backends.
func workerPool(ctx context.Context, wk *workerSide) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(wk.cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("parse database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = wk.cfg.ID
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	return pool, nil
}

// rolePeriods is a cron-like job on many replicas: for each period in turn
// it takes the lease, and inside a fenced transaction writes the period's
// row unless a row for it exists. A rejected or failed period is tried
// again. Events: "acquired" (period, fence), "wrote" or "skipped" (period,
// fence), "retry" (period, err), and "done" after the last period.
func rolePeriods(ctx context.Context, wk *workerSide) error {
	cfg := wk.cfg
	pool, client, closeAll, err := workerLeases(ctx, wk)
	if err != nil {
		return err
	}
	defer closeAll()
	table := pgx.Identifier{cfg.Table}.Sanitize()
	for p := 1; p <= cfg.Periods; p++ {
		for {
			l, err := client.Acquire(ctx, cfg.Name, cfg.TTL)
			if err != nil {
				return fmt.Errorf("period %d: %w", p, err)
			}
			wk.emit(event{Ev: "acquired", Period: p, Fence: l.Fence()})
			wrote := false
			err = fencing.InTx(l.Context(), pool, l.Token(), func(tx pgx.Tx) error {
				var n int
				if err := tx.QueryRow(l.Context(), "SELECT count(*) FROM "+table+" WHERE period = $1", p).Scan(&n); err != nil {
					return err
				}
				if n > 0 {
					return nil
				}
				wrote = true
				_, err := tx.Exec(l.Context(), "INSERT INTO "+table+" (period, worker) VALUES ($1, $2)", p, cfg.ID)
				return err
			})
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_ = l.Release(rctx) // ErrLost here is reported by InTx's result already
			cancel()
			if err == nil {
				ev := "skipped"
				if wrote {
					ev = "wrote"
				}
				wk.emit(event{Ev: ev, Period: p, Fence: l.Fence()})
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("period %d: %w", p, err)
			}
			wk.emit(event{Ev: "retry", Period: p, Fence: l.Fence(), Result: errKind(err), Err: err.Error()})
		}
	}
	wk.emit(event{Ev: "done"})
	return nil
}

// roleLease takes lease cfg.Name and then obeys commands:
//
//	write  — upsert row id=1 of cfg.Table through fencing.InTx with the
//	         lease's token, whether or not the lease is still held
//	renew  — Lease.Renew
//
// Events: "acquired" (fence, detail=owner), "lost" when the lease's Done
// closes (err = its cause), "write" and "renew" (result = errKind).
func roleLease(ctx context.Context, wk *workerSide) error {
	cfg := wk.cfg
	pool, client, closeAll, err := workerLeases(ctx, wk)
	if err != nil {
		return err
	}
	defer closeAll()
	l, err := client.Acquire(ctx, cfg.Name, cfg.TTL)
	if err != nil {
		return err
	}
	wk.emit(event{Ev: "acquired", Fence: l.Fence(), Detail: l.Owner()})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-l.Done()
		wk.emit(event{Ev: "lost", Fence: l.Fence(), Result: errKind(l.Err()), Err: errString(l.Err())})
	}()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = l.Release(rctx)
		cancel()
		<-watched
	}()
	table := pgx.Identifier{cfg.Table}.Sanitize()
	for {
		cmd, ok := wk.command(ctx)
		if !ok {
			return nil
		}
		switch cmd {
		case "write":
			// A stale holder does not know it is stale: it writes with the
			// token it has, on a context of its own.
			err := fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id, holder) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder", cfg.ID)
				return err
			})
			wk.emit(event{Ev: "write", Fence: l.Fence(), Result: errKind(err), Err: errString(err)})
		case "renew":
			err := l.Renew(ctx)
			wk.emit(event{Ev: "renew", Fence: l.Fence(), Result: errKind(err), Err: errString(err)})
		default:
			return fmt.Errorf("lease worker: unknown command %q", cmd)
		}
	}
}

// roleLock takes the advisory lock cfg.Name with pglock and then, for a
// fence, the lease cfg.Name+"/fence" with a 1s TTL (an advisory lock has no
// fence of its own; fencing tokens name a lease). Commands:
//
//	write — upsert row id=1 of cfg.Table through fencing.InTx with the
//	        lease's token
//
// Events: "acquired" (fence), "lost" when the lock's Done closes (err =
// Err()), "write" (result = errKind).
func roleLock(ctx context.Context, wk *workerSide) error {
	cfg := wk.cfg
	pool, client, closeAll, err := workerLeases(ctx, wk)
	if err != nil {
		return err
	}
	defer closeAll()
	var opts []pglock.Option
	if cfg.LivenessInterval > 0 {
		opts = append(opts, pglock.WithLivenessCheck(cfg.LivenessInterval, cfg.LivenessTimeout))
	}
	locker, err := pglock.New(pool, opts...)
	if err != nil {
		return err
	}
	lk, err := locker.Lock(ctx, cfg.Name)
	if err != nil {
		return err
	}
	lease, err := client.Acquire(ctx, cfg.Name+"/fence", time.Second)
	if err != nil {
		_ = lk.Unlock(ctx)
		return fmt.Errorf("take the fence lease: %w", err)
	}
	tok, fence := lease.Token(), lease.Fence()
	wk.emit(event{Ev: "acquired", Fence: fence})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		<-lk.Done()
		wk.emit(event{Ev: "lost", Fence: fence, Result: errKind(lk.Err()), Err: errString(lk.Err())})
	}()
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = lk.Unlock(uctx) // wraps ErrLost if it was lost: reported already
		cancel()
		<-watched
	}()
	table := pgx.Identifier{cfg.Table}.Sanitize()
	for {
		cmd, ok := wk.command(ctx)
		if !ok {
			return nil
		}
		switch cmd {
		case "write":
			err := fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
				_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id, holder) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET holder = EXCLUDED.holder", cfg.ID)
				return err
			})
			wk.emit(event{Ev: "write", Fence: fence, Result: errKind(err), Err: errString(err)})
		default:
			return fmt.Errorf("lock worker: unknown command %q", cmd)
		}
	}
}
