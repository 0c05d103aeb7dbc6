package leases

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/spans"
)

var errNoRows = pgx.ErrNoRows

// Client grants, renews and releases leases over a pool. One Client per
// process is enough; it is safe for concurrent use. It runs one keepalive
// goroutine (renewing all of its leases with one statement per tick) and,
// once something waits or observes, one listener goroutine on a dedicated
// connection, which renews a lease at once when a notification names it.
// Close stops them.
type Client struct {
	pool *pgxpool.Pool // nil over database/sql (NewDB)
	sdb  *sql.DB       // nil over pgx (New)
	q    dbx.Querier   // direct, retrying serialization failures (serial.go): every statement but the listener's
	// direct is the pool, or sdb adapted. queryGrant retries around it.
	direct dbx.Querier
	cfg    config
	log    *slog.Logger
	m      *metrics
	tr     *spans.Tracer
	// fenced configures the fenced transactions of Once and OnceTx with
	// this Client's providers.
	fenced []fencing.Option

	// shutdown is the one shutdown signal: cancelled, with cause
	// ErrClosed, under mu when Close begins. Goroutines of the Client run
	// under it; under mu, shutdown.Err() != nil says Close has begun.
	shutdown      context.Context
	beginShutdown context.CancelCauseFunc
	wg            sync.WaitGroup
	// lingering counts statements left running when their contexts
	// ended, and connections waiting for one to end: Close waits for them.
	lingering *dbx.Lingering
	kick      chan struct{} // wakes the keepalive; buffered 1
	hooks     hooks

	unregisterGauges func()

	closeOnce sync.Once
	closeErr  error

	serialOnce sync.Once   // logs the first retry of a serialization failure
	utf8       atomic.Bool // the sessions' client_encoding was found UTF8 (encoding.go)

	mu        sync.Mutex
	held      map[string]*Lease // by name: renewed by the keepalive
	releasing map[string]int    // names whose Release has not returned yet
	nextDue   time.Time         // earliest nextRenew the keepalive sleeps towards
	dl        deadlines         // held leases' local deadlines (deadline.go)
	orphans   []*Lease          // lost at the local deadline, or whose Release failed: grants to end
	ending    bool              // endOrphans is running
	queues    map[string]*queue // waiting acquirers per lease name, or semQueue(semaphore name)
	observers map[string]map[*observer]struct{}
	leading   map[string]int // Lead calls leading, by name (gauge)
	listening bool           // listener goroutine started
	listenOK  bool           // LISTEN is active right now

	imu sync.Mutex // guards in; taken before mu, never while holding it
	in  interest
}

// New returns a Client over pool. It fails on a nil pool or an invalid
// option; it does not touch the database (a missing schema is reported by
// the first call that needs it, with a hint).
func New(pool *pgxpool.Pool, opts ...Option) (*Client, error) {
	if pool == nil {
		return nil, invalid("leases: pool must not be nil")
	}
	c, err := configure(opts, false)
	if err != nil {
		return nil, err
	}
	c.pool = pool
	c.setQuerier(pool)
	c.start()
	return c, nil
}

// configure builds a Client from opts, with no database and no goroutine
// yet: New and NewDB set the database, then start it. Over database/sql
// (dbsql) notifications are off, and an option turning them on is invalid.
func configure(opts []Option, dbsql bool) (*Client, error) {
	cfg := defaultConfig()
	cfg.notify = !dbsql
	for _, opt := range opts {
		if opt == nil {
			return nil, invalid("leases: option must not be nil")
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	if dbsql && cfg.notify {
		return nil, invalid("leases: WithNotifications(true) needs a pgx pool (New); over database/sql the client polls")
	}
	mp := cfg.meter
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	fenced := []fencing.Option{fencing.WithMeterProvider(mp)}
	if cfg.tracer != nil {
		fenced = append(fenced, fencing.WithTracerProvider(cfg.tracer))
	}
	shutdown, beginShutdown := context.WithCancelCause(context.Background())
	c := &Client{
		shutdown:      shutdown,
		beginShutdown: beginShutdown,
		cfg:           cfg,
		log:           cfg.log,
		m:             newMetrics(mp, cfg.nameAttr, cfg.log),
		tr:            newTracer(cfg),
		fenced:        fenced,
		kick:          make(chan struct{}, 1),
		hooks:         hooks{listening: make(chan struct{}), listenSteady: listenSteady},
		held:          make(map[string]*Lease),
		releasing:     make(map[string]int),
		queues:        make(map[string]*queue),
		observers:     make(map[string]map[*observer]struct{}),
		leading:       make(map[string]int),
	}
	c.unregisterGauges = c.registerGauges(mp)
	return c, nil
}

// setQuerier sets the Client's statements to run over q.
func (c *Client) setQuerier(q dbx.Querier) {
	c.direct, c.q = q, serialQuerier{q: q, c: c}
	if c.lingering = dbx.LingeringOf(q); c.lingering == nil {
		c.lingering = new(dbx.Lingering)
	}
}

// start starts the keepalive goroutine.
func (c *Client) start() {
	c.wg.Add(1)
	go c.keepalive()
}

// Close stops the client: waiting Acquire calls return ErrClosed, every
// held lease is released (context cause wraps ErrReleased and ErrClosed,
// then one statement ends all of their grants, bounded by
// WithReleaseTimeout, default 5s; grants it cannot reach expire after their
// TTL, and a grant whose row another transaction keeps locked — an open
// REPEATABLE READ fenced transaction — is waited for apart from the
// others, so that it does not keep theirs), observers' channels close, and
// the keepalive and listener goroutines exit, and a grant in flight
// (Acquire, TryAcquire, a semaphore's) is cut short as the end of its
// context would, its call returning ErrClosed — unless its context never
// ends: that one runs until the server answers, and is ended then if it
// committed. Close blocks until they have, and, within the release
// timeout, until every statement of the Client whose context ended has
// ended on its connection (a database/sql driver may not end one with its
// context).
// It does not close the pool. Safe to call more than once and concurrently;
// later calls wait for the first and return its result.
func (c *Client) Close() error {
	if c == nil {
		return invalid("leases: client is nil")
	}
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.beginShutdown(ErrClosed)
		held := make([]*Lease, 0, len(c.held))
		for _, l := range c.held {
			held = append(held, l)
		}
		cause := fmt.Errorf("%w: %w", ErrReleased, ErrClosed)
		now := time.Now()
		for _, l := range held {
			l.state = stateReleasing
			c.dropLocked(l)
			c.m.recordHold(l, false, now)
			l.endLocked(cause)
		}
		c.stopDeadlinesLocked()
		c.mu.Unlock()

		// The keepalive stops renewing before the grants are ended, and
		// an endOrphans cut short by the shutdown hands its leases back.
		c.wg.Wait()
		c.mu.Lock()
		held = append(held, c.orphans...)
		c.orphans = nil
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.releaseTimeout)
		defer cancel()
		if len(held) > 0 {
			failed, err := c.releaseBatch(ctx, fmt.Sprintf("close: release %d leases", len(held)), held)
			c.closeErr = err
			unreleased := leaseSet(failed)
			c.mu.Lock()
			for _, l := range held {
				if l.state == stateReleasing && !unreleased[l] {
					l.state = stateReleased
				}
			}
			c.mu.Unlock()
		}
		// A statement whose context ended (cut short by the shutdown, as
		// the keepalive's are, or by its caller's) may still run, on a
		// connection of its own, if its driver does not end it with its
		// context (lib/pq sends a cancel request and waits for the answer).
		if n := c.lingering.Wait(ctx); n > 0 {
			c.log.Warn("leases: closed with statements still running; their connections return to the pool when they end", "statements", n)
		}
	})
	c.wg.Wait()
	c.unregisterGauges()
	return c.closeErr
}

// Get returns the live grant of the named lease, or ErrNotHeld. ctx bounds
// the query.
func (c *Client) Get(ctx context.Context, name string) (Info, error) {
	if err := validateName(name); err != nil {
		return Info{}, err
	}
	if err := c.usable(ctx); err != nil {
		return Info{}, err
	}
	if err := c.checkEncoding(ctx, "get", name); err != nil {
		return Info{}, err
	}
	info, _, err := c.get(ctx, name)
	return info, err
}

func (c *Client) get(ctx context.Context, name string) (Info, time.Duration, error) {
	info := Info{Name: name}
	var remainingUS int64
	err := c.q.QueryRow(ctx, sqlGet, name).Scan(&info.Name, &info.Owner, &info.Fence,
		&info.AcquiredAt, &info.RenewedAt, &info.ExpiresAt, &info.Data, &remainingUS)
	if errors.Is(err, errNoRows) {
		return Info{Name: name}, 0, fmt.Errorf("leases: get %q: %w", name, ErrNotHeld)
	}
	if err != nil {
		return Info{Name: name}, 0, dbError(fmt.Sprintf("get %q", name), err)
	}
	return info, time.Duration(remainingUS) * time.Microsecond, nil
}

// List returns every live grant (expires_at in the future by the database
// clock), ordered by name. ctx bounds the query.
func (c *Client) List(ctx context.Context) ([]Info, error) {
	if err := c.usable(ctx); err != nil {
		return nil, err
	}
	rows, err := c.q.Query(ctx, sqlList)
	if err != nil {
		return nil, dbError("list", err)
	}
	infos, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Info, error) {
		var i Info
		err := row.Scan(&i.Name, &i.Owner, &i.Fence, &i.AcquiredAt, &i.RenewedAt, &i.ExpiresAt, &i.Data)
		return i, err
	})
	if err != nil {
		return nil, dbError("list", err)
	}
	return infos, nil
}

// ForceRelease is the operator's break-glass: it expires the named lease's
// grant, whoever holds it, and notifies waiters. The holder learns at its
// next renewal (within TTL/3; about a round trip if its client listens)
// that its grant is gone and cancels its context; until then its fenced
// writes are already rejected. If this client holds the lease, it does not
// renew it while the force-release runs, then renews it at once and so
// loses it at once (lost counter cause force_released). The next grant
// takes a higher fence. Returns ErrNotHeld if there was no live grant.
// Safe to repeat.
//
// It never waits without bound: a holder frozen inside an open fenced
// transaction holds the lease's fence lock, and ForceRelease waits for it at
// most until ctx's deadline or WithForceReleaseTimeout (default 5s),
// whichever is sooner; then it returns a *BlockedError (matching
// ErrBlocked) naming the backends in the way. Ending them (for example
// with pg_terminate_backend, as `pgfence leases release --force
// --terminate` does) and calling again succeeds. A fenced write in a
// prepared transaction (PREPARE TRANSACTION) holds the fence lock with no
// backend at all, until COMMIT PREPARED or ROLLBACK PREPARED; the
// BlockedError names those too.
func (c *Client) ForceRelease(ctx context.Context, name string) error {
	if err := validateName(name); err != nil {
		return err
	}
	if err := c.usable(ctx); err != nil {
		return err
	}
	if err := c.checkEncoding(ctx, "force-release", name); err != nil {
		return err
	}
	timeout := c.cfg.forceTimeout
	if d, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(d))
	}
	if timeout < time.Millisecond {
		return fmt.Errorf("leases: force-release %q: %w", name, context.DeadlineExceeded)
	}
	// If the grant is ours, this force-release is what loses it: no other
	// renewal runs until the one below has found it gone.
	c.mu.Lock()
	own := c.held[name]
	c.mu.Unlock()
	if own != nil {
		own.renewMu.Lock()
		defer own.renewMu.Unlock()
	}
	sctx, span := c.tr.Start(ctx, spanForceRelease, name, 0)
	live, blocked, err := c.forceRelease(sctx, name, timeout)
	span.End(0, err)
	switch {
	case err != nil && isLockTimeout(err):
		return blocked
	case err != nil:
		return dbError(fmt.Sprintf("force-release %q", name), err)
	case live == nil || !*live:
		return fmt.Errorf("leases: force-release %q: %w", name, ErrNotHeld)
	}
	if own != nil {
		c.log.Info("leases: force-released", "name", name, "owner", own.owner, "fence", own.fence)
		c.recheck(own, lostForceReleased)
	} else {
		c.log.Info("leases: force-released", "name", name)
	}
	return nil
}

// forceRelease runs the force-release on a connection of its own while it
// watches, from another, which backends block it, so that a timeout can
// name them (and the prepared transactions, which no backend holds).
func (c *Client) forceRelease(ctx context.Context, name string, timeout time.Duration) (*bool, *BlockedError, error) {
	var (
		q   dbx.Querier
		pid uint32
	)
	if c.pool != nil {
		conn, err := c.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		defer conn.Release()
		q, pid = conn, conn.Conn().PgConn().PID()
	} else {
		conn, err := c.sdb.Conn(ctx)
		if err != nil {
			return nil, nil, err
		}
		defer conn.Close()
		q = dbx.SQL(conn)
		if pid, err = dbx.BackendPID(ctx, q); err != nil {
			return nil, nil, err
		}
	}
	var (
		wg       sync.WaitGroup
		blockers []Backend
	)
	wctx, stop := context.WithCancel(ctx)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTimer(min(50*time.Millisecond, timeout/2))
		defer t.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
			if bs, err := c.blockers(wctx, pid, name); err == nil && len(bs) > 0 {
				blockers = bs
			}
			t.Reset(100 * time.Millisecond)
		}
	}()
	var live *bool
	err := c.serially(ctx, func() error {
		return q.QueryRow(ctx, sqlForceRelease, name, max(timeout.Milliseconds(), 1)).Scan(&live)
	})
	stop()
	wg.Wait()
	if err == nil || !isLockTimeout(err) {
		return live, nil, err
	}
	blocked := &BlockedError{Name: name, Blockers: blockers}
	if len(blockers) == 0 {
		// The watcher saw no blocker in time (on a loaded machine its
		// connection can take longer than a short timeout): the fence
		// lock's holders are still there to name, on this connection.
		if bs, ferr := queryBackends(ctx, q, sqlFenceHolders, name, int64(pid)); ferr == nil {
			blocked.Blockers = bs
		}
	}
	// pg_blocking_pids reports a prepared transaction as pid 0, which no
	// backend has: look for them by the lock itself.
	if ps, perr := queryPrepared(ctx, q, name); perr == nil {
		blocked.Prepared = ps
	}
	return live, blocked, err
}

// queryPrepared describes, on q, the prepared transactions that hold the
// fence lock of lease name.
func queryPrepared(ctx context.Context, q dbx.Querier, name string) ([]PreparedTransaction, error) {
	rows, err := q.Query(ctx, sqlFencePrepared, name)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PreparedTransaction, error) {
		var p PreparedTransaction
		err := row.Scan(&p.GID, &p.Owner, &p.Prepared)
		return p, err
	})
}

// blockers describes the backends that block backend pid, a
// force-release of lease name (see sqlBlockers).
func (c *Client) blockers(ctx context.Context, pid uint32, name string) ([]Backend, error) {
	return queryBackends(ctx, c.q, sqlBlockers, name, int64(pid))
}

// queryBackends runs on q a query that starts with sqlBackends.
func queryBackends(ctx context.Context, q dbx.Querier, sql string, args ...any) ([]Backend, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Backend, error) {
		var b Backend
		var xactStart, stateChange *time.Time
		err := row.Scan(&b.PID, &b.Application, &b.ClientAddr, &xactStart, &stateChange)
		if xactStart != nil {
			b.Since = *xactStart
		} else if stateChange != nil {
			b.Since = *stateChange
		}
		return b, err
	})
}

// newOwner returns the client's owner prefix with a fresh random suffix.
func (c *Client) newOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	return c.cfg.owner + "-" + hex.EncodeToString(b[:])
}

// releaseBatch ends the given grants now, notifying, in one statement
// unless some of their rows are locked. With the error it returns the
// leases whose grants it may not have ended: those whose rows stayed
// locked, or, on any other error, all of them.
func (c *Client) releaseBatch(ctx context.Context, op string, ls []*Lease) (failed []*Lease, err error) {
	ctx, span := c.tr.Start(ctx, spanRelease, "", 0)
	defer func() { span.End(0, err) }()
	var stuck []*Lease
	if err := c.releaseSplit(ctx, ls, &stuck); err != nil {
		return ls, dbError(op, err)
	}
	// The rows still locked wait together, past the lock wait, for as
	// long as ctx allows: the others' grants are ended already.
	if len(stuck) > 0 {
		if err := c.releaseRows(ctx, stuck, "0"); err != nil {
			c.wakeQueues(ls, stuck)
			return stuck, dbError(fmt.Sprintf("%s: %d of %d rows locked by another transaction (%s)", op, len(stuck), len(ls), leaseNames(stuck)), err)
		}
	}
	c.wakeQueues(ls, nil)
	return nil, nil
}

// wakeQueues wakes this process's waiters for the leases of ls but
// those of except: for the grants that were ended.
func (c *Client) wakeQueues(ls, except []*Lease) {
	skip := leaseSet(except)
	for _, l := range ls {
		if !skip[l] {
			c.wakeQueue(l.queue())
		}
	}
}

// releaseLockWait is how long a batched release waits for a row that
// another transaction has locked — a REPEATABLE READ fenced transaction
// share-locks its lease's row until it ends — before it splits the batch,
// so that one lease whose row stays locked does not keep the others'
// grants alive.
const releaseLockWait = "100ms"

// releaseSplit ends ls's grants in one statement that waits at most
// releaseLockWait for a locked row. When the wait runs out it tries each
// half of ls in turn, down to single leases, which it adds to stuck.
func (c *Client) releaseSplit(ctx context.Context, ls []*Lease, stuck *[]*Lease) error {
	err := c.releaseRows(ctx, ls, releaseLockWait)
	if !isLockTimeout(err) {
		return err
	}
	if len(ls) == 1 {
		*stuck = append(*stuck, ls[0])
		return nil
	}
	mid := len(ls) / 2
	if err := c.releaseSplit(ctx, ls[:mid], stuck); err != nil {
		return err
	}
	return c.releaseSplit(ctx, ls[mid:], stuck)
}

// releaseRows ends ls's grants in one statement, waiting at most lockWait
// (a lock_timeout) for a locked row.
func (c *Client) releaseRows(ctx context.Context, ls []*Lease, lockWait string) error {
	names := make([]string, len(ls))
	owners := make([]string, len(ls))
	fences := make([]int64, len(ls))
	for i, l := range ls {
		names[i], owners[i], fences[i] = l.name, l.owner, l.fence
	}
	q := sqlReleaseBatch
	if c.cfg.durableRelease {
		q = sqlReleaseBatchDurable
	}
	_, err := c.q.Exec(ctx, q, names, owners, fences, lockWait)
	return err
}

// leaseSet is ls as a set.
func leaseSet(ls []*Lease) map[*Lease]bool {
	set := make(map[*Lease]bool, len(ls))
	for _, l := range ls {
		set[l] = true
	}
	return set
}

// leaseNames lists up to five of ls's names, for an error.
func leaseNames(ls []*Lease) string {
	var b strings.Builder
	for i, l := range ls {
		if i == 5 {
			fmt.Fprintf(&b, ", and %d more", len(ls)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", l.name)
	}
	return b.String()
}

func (c *Client) setState(l *Lease, s leaseState) {
	c.mu.Lock()
	l.state = s
	c.mu.Unlock()
}

// isClosed reports whether Close has begun.
func (c *Client) isClosed() bool { return c.shutdown.Err() != nil }
