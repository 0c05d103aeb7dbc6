package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/internal/names"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// defaultGrace is how long a command gets between SIGTERM and SIGKILL
// after its lease or lock is lost; with a lease, at most maxGrace(TTL).
const defaultGrace = 10 * time.Second

// maxRunTTL bounds --ttl: how long a run that died (the machine lost)
// keeps others from the lease.
const maxRunTTL = 24 * time.Hour

// releaseTimeout bounds the release after the command exits, and what run
// does after it (closing its connections); expiry (or the session's end,
// for a lock) is the fallback.
const releaseTimeout = 5 * time.Second

const runLong = `Run a command while holding a lease (--lease, with --ttl) or a session
advisory lock (--lock), and release it when the command exits.

By default run waits for the lease or lock; with --no-wait it exits 75 at
once when someone else holds it, naming the holder on stderr, and after 5s
when the lease's last grant has expired but a fenced transaction of its
holder is still open (a frozen holder: the takeover waits for it). A grant
that did not come within 5s while nobody holds the lease (it waited for a
lock on pgfence.leases, or a server that stopped answering) exits 69.

The command gets these environment variables:
  --lease:  PGFENCE_LEASE (the name) and PGFENCE_FENCE (this grant's fence:
            pass it to any system that should reject stale writers)
  --lock:   PGFENCE_LOCK (the name) and PGFENCE_LOCK_KEY (its bigint key)
They replace any of the same name in pgfence's own environment (say, from
an outer pgfence run), so the command reads its own grant's.

Timing (--lease): the command stops before anyone else can be granted the
lease. pgfence trusts the lease until its local deadline,
  deadline = start of the last successful renewal + TTL - TTL/10,
which comes before the database can expire the lease. The command gets
SIGTERM at deadline - grace and SIGKILL at the deadline, unless a renewal
moves the deadline first; pgfence renews every (TTL - TTL/10 - grace)/3, at
most every TTL/3. So --grace must be at most TTL/2: a longer --grace is
refused, and the default (10s) is cut to TTL/2 for a TTL under 20s. When
the lease is lost earlier (force-released: renewal finds it gone) the
command gets SIGTERM at once and SIGKILL grace later, at the deadline at
the latest. With --lock the command gets SIGTERM when the lock's session
dies, and SIGKILL grace later.

This holds when pgfence is cut off from the database, frozen (SIGSTOP) or
killed: pgfence starts the command through a small helper process of its
own (the reaper: pgfence re-executes itself), which keeps the timer to the
deadline and, if pgfence dies, sends SIGTERM and SIGKILL as above (with
--lock, SIGKILL at once: the lock ends with pgfence's session). The
reaper kills the command's whole tree: its process group and, as a child
subreaper, every process below it that moved to a group or session of its
own. When the command exits, processes it left running get SIGTERM and
SIGKILL grace later before the lease or lock is released. Exactly-once
effects still need fences: pass PGFENCE_FENCE on.

The command runs in its own process group: SIGINT, SIGTERM, SIGHUP, SIGUSR1
and SIGUSR2 sent to pgfence are forwarded to it (so it should not read from
a terminal).

Exit status: the command's (128+N if it died of signal N), but 1 if it
exited 0 after the lease or lock was lost; 75 when held with --no-wait;
126/127 when the command cannot be executed or is not found; 1 or 69 when
pgfence could not take the lease; 128+N when pgfence was interrupted by
signal N before the command started (it did not run); 2 for bad usage.

Flags go before the command; '--' before the command is optional.
`

const runExamples = `
Examples:
  pgfence run --lease billing/nightly --ttl 1m --no-wait -- ./bill-customers
  pgfence run --lock reindex -- psql -c 'REINDEX TABLE orders'`

type runOptions struct {
	lease, lock string
	ttl, grace  time.Duration
	noWait      bool
	once        onceOptions
}

func newRunCmd(g *globals) *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run (--lease NAME --ttl D [--once KEY] [--at-least D] | --lock NAME) [--no-wait] [--grace D] -- CMD [ARGS...]",
		Short: "Run a command under a lease or an advisory lock",
		Long:  runLong + "\n" + onceHelp + "\n" + runExamples,
		Args: argsUsage(func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("run needs a command to run after the flags (pgfence run --lease NAME --ttl 30s -- CMD ARGS...)")
			}
			return nil
		}),
		RunE: action(func(cmd *cobra.Command, args []string) error {
			if err := o.resolve(cmd); err != nil {
				return err
			}
			return runUnder(cmd, g, o, args)
		}),
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything from the command on is the command's
	f.StringVar(&o.lease, "lease", "", "lease name to hold while the command runs")
	f.StringVar(&o.lock, "lock", "", "advisory lock name to hold while the command runs")
	f.DurationVar(&o.ttl, "ttl", 0, fmt.Sprintf("lease TTL, required with --lease (%s to %s); renewed at least every TTL/3", leases.MinTTL, maxRunTTL))
	f.DurationVar(&o.grace, "grace", defaultGrace, "time between SIGTERM and SIGKILL; with --lease at most TTL/2, and the default is cut to TTL/2 (see Timing)")
	f.BoolVar(&o.noWait, "no-wait", false, "exit 75 at once if someone else holds the lease or lock")
	addOnceFlags(f, &o.once)
	return cmd
}

// resolve fills the defaults that depend on other flags and validates.
func (o *runOptions) resolve(cmd *cobra.Command) error {
	// A flag given an empty value (an unset variable: --once "$PERIOD")
	// is a mistake, not the flag left out: --once "" would run the
	// command every time, --lease "" --lock x would quietly take the lock.
	for _, f := range []string{"lease", "lock"} {
		if v, _ := cmd.Flags().GetString(f); v == "" && cmd.Flags().Changed(f) {
			return usageErrorf("--%s must not be empty", f)
		}
	}
	if o.once.key == "" && cmd.Flags().Changed("once") {
		return usageErrorf("--once key %v", names.Check(o.once.key, leases.MaxPeriodLen))
	}
	if o.lease != "" && !cmd.Flags().Changed("grace") {
		o.grace = min(defaultGrace, maxGrace(o.ttl))
	}
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
	case o.lease != "" && o.ttl > maxRunTTL:
		return usageErrorf("--ttl must be at most %s, got %s: a run that dies keeps the lease for its TTL, "+
			"and a long job needs no long TTL (the lease is renewed every TTL/3)", maxRunTTL, o.ttl)
	case o.grace < 0:
		return usageErrorf("--grace must not be negative, got %s", o.grace)
	case o.lease != "" && o.grace > maxGrace(o.ttl):
		return usageErrorf("--grace %s does not fit --ttl %s: the command gets SIGTERM grace before the lease's local deadline, "+
			"so that it has stopped before the lease can expire; --grace must be at most TTL/2 (%s) (see 'pgfence run --help', Timing)",
			o.grace, o.ttl, maxGrace(o.ttl))
	}
	if err := o.once.validate(o.lease); err != nil {
		return usageErrorf("%v", err)
	}
	if o.lease != "" {
		return validateLeaseName(o.lease)
	}
	return validateName("lock name", o.lock, pglock.MaxNameLen)
}

// held is what run holds while the command runs: a lease or a lock.
type held struct {
	what    string        // `lease "x" (fence 7)`, for messages
	lease   *leases.Lease // nil for a lock
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
	// Catch the forwarded signals from the start: until the command
	// starts, SIGINT, SIGTERM and SIGHUP abandon the run (the wait for the
	// lease or lock, and whatever precedes the start once it is held);
	// afterwards they are the command's.
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
	// stopWatch ends the watch (once) and returns the interruption, if
	// one came: after it, interruptSig is safe to read and stays put.
	var stopped bool
	stopWatch := func() error {
		if !stopped {
			stopped = true
			close(quit)
			<-interrupted
		}
		return interruptedOr(interruptSig, nil)
	}
	// abandon ends a run whose command did not start, reporting an
	// interruption as such rather than as what it made fail.
	var h *held
	// shutdownBy, once set (after the command, or a release when it
	// did not start), is when run stops waiting for its release and
	// for closing its connections.
	var shutdownBy time.Time
	release := func() {
		shutdownBy = time.Now().Add(releaseTimeout)
		releaseHeld(h, shutdownBy)
	}
	abandon := func(err error) error {
		ierr := stopWatch()
		if h != nil {
			release()
		}
		if ierr != nil {
			return ierr
		}
		return err
	}

	pool, err := openPool(ctx, g.connString(), "pgfence run", 4)
	if err != nil {
		return abandon(err)
	}
	var lc *leases.Client
	defer func() {
		by := shutdownBy
		if by.IsZero() {
			by = time.Now().Add(releaseTimeout)
		}
		closeBy(by, func() {
			if lc != nil {
				lc.Close()
			}
			pool.Close()
		})
	}()
	if o.lease != "" {
		lc, err = leases.New(pool)
		if err == nil {
			h, err = takeLease(ctx, pool, lc, o)
		}
	} else {
		h, err = takeLock(ctx, pool, o)
	}
	if err != nil {
		return abandon(err)
	}

	if h.lease != nil {
		if err := o.once.hold(h.lease); err != nil {
			return abandon(err)
		}
		skip, err := o.once.skip(ctx, lc, h.lease)
		if err != nil {
			return abandon(fmt.Errorf("read period %q of %s: %w", o.once.key, h.what, err))
		}
		if skip {
			if err := abandon(nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pgfence: period %q of lease %q is already done; the command did not run\n", o.once.key, o.lease)
			return nil
		}
	}

	code, err := runChild(ctx, h, o, path, args, sigs, stopWatch, cmd.ErrOrStderr())
	if err != nil && stopWatch() != nil { // the command did not start
		return abandon(err)
	}
	if err == nil && code == 0 && h.lease != nil {
		// Bounded as a one-shot command's statements are: a database that
		// stops answering must not keep pgfence, and the lease its
		// keepalive renews, for good. The period is then left undone.
		rctx, rcancel := context.WithTimeoutCause(context.WithoutCancel(ctx), answerTimeout, errNoAnswer)
		rerr := o.once.record(rctx, pool, h.lease)
		why := "the lease was lost?"
		if errors.Is(context.Cause(rctx), errNoAnswer) {
			why = fmt.Sprintf("the database did not answer within %s", answerTimeout)
		}
		rcancel()
		if rerr != nil {
			release()
			return fmt.Errorf("the command succeeded but period %q of %s could not be recorded as done (%s): %w", o.once.key, h.what, why, rerr)
		}
	}
	release()
	if err != nil {
		return err
	}
	if code == 0 {
		return nil
	}
	return &exitError{code: code}
}

// runChild runs the command through the reaper while h is held, renewing
// a lease and passing each new local deadline on (deadline.go), and returns
// its exit status. Right before the command starts it calls stopWatch,
// which ends run's watch for interruptions: the command is not started
// when one came.
func runChild(ctx context.Context, h *held, o runOptions, path string, args []string, sigs <-chan os.Signal, stopWatch func() error, stderr io.Writer) (int, error) {
	c, err := startReaper(os.Stdin, os.Stdout, os.Stderr)
	if err != nil {
		return 0, err
	}
	cfg := reaperConfig{Path: path, Args: args, Env: childEnv(os.Environ(), h.env), What: h.what, Grace: o.grace}
	var deadlines chan int64 // nil for a lock: no deadline
	var r *renewer
	if h.lease != nil {
		r = newRenewer(h.lease, o.grace)
		d, err := r.first(ctx)
		if err != nil {
			c.abandon()
			return 0, fmt.Errorf("%s: lost before the command started: %w", h.what, err)
		}
		cfg.Deadline, cfg.OrphanGrace, deadlines = d, o.grace, r.deadlines
	}
	if err := stopWatch(); err != nil {
		c.abandon()
		return 0, err
	}
	if err := c.start(cfg); err != nil {
		c.abandon()
		return 0, err
	}
	if r != nil {
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.run(rctx) }()
		defer func() { stop(); <-done }()
	}
	return c.supervise(sigs, deadlines, h.done, h.what, h.cause, stderr), nil
}

// childEnv is the command's environment: environ without the variables
// set names (an outer `pgfence run`'s PGFENCE_LEASE, say), then set. Both
// C's getenv and Go's os.Getenv read the first entry of a name, so an
// inherited one left in place would hide the grant's own.
func childEnv(environ, set []string) []string {
	env := make([]string, 0, len(environ)+len(set))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if !slices.ContainsFunc(set, func(s string) bool { return strings.HasPrefix(s, k+"=") }) {
			env = append(env, kv)
		}
	}
	return append(env, set...)
}

// releaseHeld releases h, waiting until by at most.
func releaseHeld(h *held, by time.Time) {
	ctx, cancel := context.WithDeadline(context.Background(), by)
	defer cancel()
	_ = h.release(ctx) // a lost lease or lock fails to release; expiry covers the rest
}

// closeBy runs closeAll (the leases client's and the pool's Close), and
// waits for it until by at most: run is about to exit, and the kernel
// closes the connections left, ending their sessions (and a lock's);
// a lease's grant expires after its TTL. Unbounded, a silent network kept
// run 15s after its command: pgx cleans up a connection whose statement
// was cancelled (a renewal in flight, the release) for up to 15s, and
// pgxpool's Close waits for that; the leases client's Close tries a
// failed release once more, for up to 5s.
func closeBy(by time.Time, closeAll func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		closeAll()
	}()
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// interruptedOr reports a run interrupted before its command started as
// 128+signal, else err.
func interruptedOr(sig syscall.Signal, err error) error {
	if sig != 0 {
		return &exitError{code: 128 + int(sig), err: fmt.Errorf("interrupted (%v) before the command started; the command did not run", sig)}
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
		// A grant that has expired is taken over only once its holder's
		// open fenced transactions end (the fence lock): bounded here, as
		// a force-release's wait is, so that a frozen holder does not
		// stack up a waiting run per cron tick.
		tctx, cancel := context.WithTimeout(ctx, leases.DefaultForceReleaseTimeout)
		l, err = lc.TryAcquire(tctx, o.lease, o.ttl)
		cancel()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			return nil, notGranted(ctx, pool, o.lease, err)
		}
	} else {
		l, err = lc.Acquire(ctx, o.lease, o.ttl)
	}
	if err != nil {
		var he *leases.HeldError
		if errors.As(err, &he) {
			return nil, &exitError{code: exitHeld, err: fmt.Errorf("lease %q is held by %s (fence %d, expires in %s)",
				o.lease, display(he.Holder.Owner), he.Holder.Fence, expiresIn(ctx, pool, he.Holder.ExpiresAt))}
		}
		return nil, fmt.Errorf("acquire lease %q: %w", o.lease, err)
	}
	return &held{
		what:  fmt.Sprintf("lease %q (fence %d)", l.Name(), l.Fence()),
		lease: l,
		env: []string{
			"PGFENCE_LEASE=" + l.Name(),
			"PGFENCE_FENCE=" + strconv.FormatInt(l.Fence(), 10),
		},
		done:    l.Done(),
		cause:   l.Err,
		release: l.Release,
	}, nil
}

// notGranted explains a --no-wait grant that did not come within
// DefaultForceReleaseTimeout (err). Its likely cause is a frozen holder: the
// last grant has expired, but the holder's open fenced transaction holds the
// fence lock, which a takeover waits for — exit 75, as when the lease is
// held. It is checked, with a read of the lease's row bounded as the wait
// was: a grant also waits for a lock on pgfence.leases (a migration, an
// operator's LOCK TABLE) or a server that stopped answering, and then
// nobody holds the lease and exit 75 ("someone else is doing it") would
// hide that the job no longer runs: exit 69, as the one-shot commands do.
func notGranted(ctx context.Context, pool *pgxpool.Pool, lease string, err error) error {
	pctx, cancel := context.WithTimeout(ctx, leases.DefaultForceReleaseTimeout)
	defer cancel()
	var expired bool
	perr := pool.QueryRow(pctx, sqlLeaseExpired, lease).Scan(&expired)
	switch {
	case perr == nil && expired:
		return &exitError{code: exitHeld, err: fmt.Errorf("lease %q was not granted within %s: its last grant has expired, but a fenced transaction of its holder is still open ('pgfence check' names it; 'pgfence leases release --force --terminate %s' ends it): %w",
			lease, leases.DefaultForceReleaseTimeout, shellArg(lease), err)}
	case perr == nil:
		return &exitError{code: exitHeld, err: fmt.Errorf("lease %q was not granted within %s, and is held now: %w", lease, leases.DefaultForceReleaseTimeout, err)}
	case errors.Is(perr, pgx.ErrNoRows) || errors.Is(perr, context.DeadlineExceeded):
		return &exitError{code: exitUnavailable, err: fmt.Errorf("lease %q was not granted within %s, and nobody holds it: the database did not answer in time "+
			"(the grant waited for a lock on pgfence.leases, a migration's say, which pg_locks names; or a server frozen or cut off once connected): %w",
			lease, leases.DefaultForceReleaseTimeout, err)}
	}
	return fmt.Errorf("lease %q was not granted within %s (%w), and its row could not be read: %w", lease, leases.DefaultForceReleaseTimeout, err, perr)
}

// expiresIn renders how long until t by the database clock.
func expiresIn(ctx context.Context, pool *pgxpool.Pool, t time.Time) string {
	var now time.Time
	if err := pool.QueryRow(ctx, sqlNow).Scan(&now); err != nil {
		return "at " + t.UTC().Format(time.RFC3339)
	}
	return human(t.Sub(now))
}
