package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/leases"
)

// defaultGrace is how long a command gets between SIGTERM and SIGKILL
// after its lease or lock is lost.
const defaultGrace = 10 * time.Second

// releaseTimeout bounds the release after the command exits; expiry (or
// the session's end, for a lock) is the fallback.
const releaseTimeout = 5 * time.Second

const runLong = `Run a command while holding a lease (--lease, with --ttl) or a session
advisory lock (--lock), and release it when the command exits.

By default run waits for the lease or lock; with --no-wait it exits 75 at
once when someone else holds it, naming the holder on stderr.

The command gets these environment variables:
  --lease:  PGFENCE_LEASE (the name) and PGFENCE_FENCE (this grant's fence:
            pass it to any system that should reject stale writers)
  --lock:   PGFENCE_LOCK (the name) and PGFENCE_LOCK_KEY (its bigint key)

pgfence renews the lease every TTL/3 while the command runs. If the lease is
lost (force-released, or not renewed in time) or the lock's session dies, it
sends SIGTERM to the command's process group and SIGKILL after --grace. The
command runs in its own process group: SIGINT, SIGTERM, SIGHUP, SIGUSR1 and
SIGUSR2 sent to pgfence are forwarded to it (so it should not read from a
terminal). If pgfence itself is killed, the command is killed too.

Exit status: the command's (128+N if it died of signal N); 75 when held with
--no-wait; 126/127 when the command cannot be executed or is not found; 1 or
69 when pgfence could not take the lease; 2 for bad usage.

Flags go before the command; '--' before the command is optional.

Examples:
  pgfence run --lease billing/nightly --ttl 1m --no-wait -- ./bill-customers
  pgfence run --lock reindex -- psql -c 'REINDEX TABLE orders'`

type runOptions struct {
	lease, lock string
	ttl, grace  time.Duration
	noWait      bool
}

func newRunCmd(g *globals) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run (--lease NAME --ttl D | --lock NAME) [--no-wait] [--grace D] -- CMD [ARGS...]",
		Short: "Run a command under a lease or an advisory lock",
		Long:  runLong,
		Args: argsUsage(func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("run needs a command to run after the flags (pgfence run --lease NAME --ttl 30s -- CMD ARGS...)")
			}
			return nil
		}),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			if err := o.validate(cmd); err != nil {
				return err
			}
			return runUnder(cmd, g, o, args)
		}),
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything from the command on is the command's
	f.StringVar(&o.lease, "lease", "", "lease name to hold while the command runs")
	f.StringVar(&o.lock, "lock", "", "advisory lock name to hold while the command runs")
	f.DurationVar(&o.ttl, "ttl", 0, fmt.Sprintf("lease TTL, required with --lease (at least %s); renewed every TTL/3", leases.MinTTL))
	f.DurationVar(&o.grace, "grace", defaultGrace, "time between SIGTERM and SIGKILL after the lease or lock is lost")
	f.BoolVar(&o.noWait, "no-wait", false, "exit 75 at once if someone else holds the lease or lock")
	return cmd
}

func (o runOptions) validate(cmd *cobra.Command) error {
	switch {
	case o.lease == "" && o.lock == "":
		return usageErrorf("run needs --lease NAME (with --ttl) or --lock NAME")
	case o.lease != "" && o.lock != "":
		return usageErrorf("run takes --lease or --lock, not both")
	case o.lock != "" && cmd.Flags().Changed("ttl"):
		return usageErrorf("--ttl applies to --lease only: a lock is held as long as its session lives")
	case o.lease != "" && !cmd.Flags().Changed("ttl"):
		return usageErrorf("--lease needs --ttl (at least %s), e.g. --ttl 30s", leases.MinTTL)
	case o.lease != "" && o.ttl < leases.MinTTL:
		return usageErrorf("--ttl must be at least %s, got %s", leases.MinTTL, o.ttl)
	case o.grace < 0:
		return usageErrorf("--grace must not be negative, got %s", o.grace)
	}
	if o.lease != "" {
		return validateLeaseName(o.lease)
	}
	if o.lock == "" {
		return usageErrorf("lock name must not be empty")
	}
	return nil
}

// held is what run holds while the command runs: a lease or a lock.
type held struct {
	what    string // `lease "x" (fence 7)`, for messages
	env     []string
	done    <-chan struct{}
	cause   func() error
	release func(context.Context) error
}

func runUnder(cmd *cobra.Command, g *globals, o runOptions, args []string) error {
	path, err := resolveCommand(args[0])
	if err != nil {
		return err
	}
	// Catch the forwarded signals from the start: before the command runs,
	// SIGINT, SIGTERM and SIGHUP abandon the wait; afterwards they are the
	// command's.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancelCause(cmd.Context())
	defer cancel(nil)
	// ctx is cancelled only by an interruption (or when run returns): the
	// lease or lock may outlive the acquire call's context otherwise.
	interrupted, quit := make(chan struct{}), make(chan struct{})
	var interruptSig syscall.Signal
	go func() {
		defer close(interrupted)
		for {
			select {
			case s := <-sigs:
				if s == syscall.SIGUSR1 || s == syscall.SIGUSR2 {
					continue // nothing to forward them to yet
				}
				interruptSig = s.(syscall.Signal)
				cancel(fmt.Errorf("interrupted by %v", s))
				return
			case <-quit:
				return
			}
		}
	}()
	stopWatch := func() { close(quit); <-interrupted }

	pool, err := openPool(ctx, g.connString(), "pgfence run", 4)
	if err != nil {
		stopWatch()
		return interruptedOr(interruptSig, err)
	}
	defer pool.Close()
	var h *held
	var lc *leases.Client
	if o.lease != "" {
		lc, err = leases.New(pool)
		if err == nil {
			defer lc.Close()
			h, err = takeLease(ctx, pool, lc, o)
		}
	} else {
		h, err = takeLock(ctx, pool, o)
	}
	stopWatch()
	if err != nil {
		return interruptedOr(interruptSig, err)
	}
	if interruptSig != 0 { // interrupted just as the wait ended
		releaseHeld(h)
		return interruptedOr(interruptSig, nil)
	}

	c, err := startChild(path, args, h.env, os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		releaseHeld(h)
		return err
	}
	code, _ := c.supervise(sigs, h.done, h.what, h.cause, o.grace, cmd.ErrOrStderr())
	releaseHeld(h)
	if code == 0 {
		return nil
	}
	return &exitError{code: code}
}

func releaseHeld(h *held) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	_ = h.release(ctx) // a lost lease or lock fails to release; expiry covers the rest
}

// interruptedOr reports an interrupted wait as 128+signal, else err.
func interruptedOr(sig syscall.Signal, err error) error {
	if sig != 0 {
		return &exitError{code: 128 + int(sig), err: fmt.Errorf("interrupted (%v) while waiting for the lease or lock; the command did not run", sig)}
	}
	return err
}

func takeLease(ctx context.Context, pool *pgxpool.Pool, lc *leases.Client, o runOptions) (*held, error) {
	if err := checkSchema(ctx, pool); err != nil {
		return nil, err
	}
	var l *leases.Lease
	var err error
	if o.noWait {
		l, err = lc.TryAcquire(ctx, o.lease, o.ttl)
	} else {
		l, err = lc.Acquire(ctx, o.lease, o.ttl)
	}
	if err != nil {
		var he *leases.HeldError
		if errors.As(err, &he) {
			return nil, &exitError{code: exitHeld, err: fmt.Errorf("lease %q is held by %s (fence %d, expires in %s)",
				o.lease, he.Holder.Owner, he.Holder.Fence, expiresIn(ctx, pool, he.Holder.ExpiresAt))}
		}
		return nil, fmt.Errorf("acquire lease %q: %w", o.lease, err)
	}
	return &held{
		what: fmt.Sprintf("lease %q (fence %d)", l.Name(), l.Fence()),
		env: []string{
			"PGFENCE_LEASE=" + l.Name(),
			"PGFENCE_FENCE=" + strconv.FormatInt(l.Fence(), 10),
		},
		done:    l.Done(),
		cause:   l.Err,
		release: l.Release,
	}, nil
}

// expiresIn renders how long until t by the database clock.
func expiresIn(ctx context.Context, pool *pgxpool.Pool, t time.Time) string {
	var now time.Time
	if err := pool.QueryRow(ctx, sqlNow).Scan(&now); err != nil {
		return "at " + t.UTC().Format(time.RFC3339)
	}
	return human(t.Sub(now))
}
