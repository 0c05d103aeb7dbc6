package leases

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The listener is one goroutine per Client, started the first time
// something waits or observes, stopped by Close. It takes two connections
// from the pool and hijacks them (so the pool's connect hooks apply and the
// pool opens others in their place): on one it LISTENs on pgfence_leases,
// on the other it holds the wait keys of the names this client waits for
// (see interest.go), so that releases of those names notify; and it wakes
// the head waiter and the observers of each released name. Whenever LISTEN
// (re)starts it wakes every waiter and observer, and has every held lease
// renewed, since releases, force-releases and hand-over requests may have
// gone unnoticed meanwhile. If LISTEN fails, waiters poll with backoff and
// the listener retries, from half a second doubling to 30s; once it has
// listened for listenSteady, its next failure starts from half a second
// again.
//
// # The probe
//
// Behind a transaction-mode pooler (PgBouncer pool_mode=transaction) LISTEN
// succeeds, but on whichever server session ran that one transaction; the
// pooler hands that session to other clients and never forwards its
// notifications to the listener. So after each LISTEN the listener proves
// that notifications reach it: it sends a probe NOTIFY on the channel from
// another connection of the pool (never from its own: a session always
// receives its own notifications, and behind the pooler its own NOTIFY
// would run on the very session that listens) and waits up to
// probeTimeout for it. Only then does it count as listening. A probe that
// does not arrive is retried with backoff, on a new connection, like any
// listener failure (a loaded machine may be that slow once); if
// probeAttempts probes in a row never arrive, notifications are off for
// the rest of the Client's life: it logs that once at Info, closes its
// connection and exits, and waiters poll (WithPollInterval). A probe that
// cannot be sent is an ordinary listener failure, retried with backoff.
//
// A probe's payload is probePrefix, 64 random hex digits and filler up to
// MaxNameLen+50 bytes. Lease names are at most MaxNameLen bytes, so a probe
// can never name a lease, and no waiter or observer mistakes one (this
// Client's or another's) for a release.

const (
	listenRetryMin = 500 * time.Millisecond
	listenRetryMax = 30 * time.Second
	// listenSteady is how long a listener must have listened for its next
	// failure to be retried from listenRetryMin again: the backoff an
	// outage grew must not delay the recovery from a failure days later,
	// and a listener that fails as soon as it listens must not reconnect
	// every half second.
	listenSteady = time.Minute

	// probeSendTimeout bounds sending the probe (acquiring a pool
	// connection included); failing to send is retried, not taken as a
	// pooler.
	probeSendTimeout = 10 * time.Second
	// probeTimeout is how long the listener waits for its probe after
	// PostgreSQL committed it. Directly or through session pooling it
	// arrives within a round trip; the generous bound keeps a loaded
	// machine from switching notifications off for good.
	probeTimeout = 2 * time.Second
	// probeAttempts is how many probes in a row must fail to arrive before
	// the listener gives up for good: one late probe on a loaded machine
	// must not turn notifications off for the Client's life.
	probeAttempts = 3

	// probePrefix starts every probe payload. A probe payload is longer
	// than MaxNameLen, so it can never be a lease name.
	probePrefix = "pgfence-probe:"
)

// errNoNotifications means LISTEN succeeded but the probe notification
// never arrived: notifications cannot reach this client.
var errNoNotifications = errors.New("leases: listener: LISTEN succeeded but its probe notification never arrived")

// probePayload returns a new probe payload: probePrefix, random hex, and
// filler up to MaxNameLen+50 bytes.
func probePayload() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	p := probePrefix + hex.EncodeToString(b[:])
	return p + strings.Repeat("-", MaxNameLen+50-len(p))
}

// isProbe reports whether payload is a probe's rather than a lease name.
func isProbe(payload string) bool {
	return len(payload) > MaxNameLen && strings.HasPrefix(payload, probePrefix)
}

// startListener starts the listener goroutine once, unless notifications
// are off or the client is closing.
func (c *Client) startListener() {
	if !c.cfg.notify {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listening || c.isClosed() {
		return
	}
	c.listening = true
	c.wg.Add(1)
	go c.listen()
}

func (c *Client) listen() {
	defer c.wg.Done()
	ctx := c.shutdown
	backoff := listenRetryMin
	late := 0 // probes in a row that did not arrive
	for {
		began, err := c.listenOnce(ctx)
		c.setListening(false)
		if ctx.Err() != nil {
			return
		}
		if !began.IsZero() && time.Since(began) >= c.hooks.listenSteady {
			backoff = listenRetryMin
		}
		wait := jitter(backoff)
		switch {
		case !errors.Is(err, errNoNotifications):
			late = 0
			c.log.Warn("leases: listener failed; waiters poll until it is back", "err", err, "retry", wait)
		case late+1 >= probeAttempts:
			// Leave c.listening set: no listener starts again.
			c.log.Info("leases: notifications do not reach this client (a pooler in transaction or statement mode, such as PgBouncer?); waiters poll from now on",
				"poll_interval", c.cfg.pollInterval)
			return
		default:
			late++
			c.log.Info("leases: the listener's probe notification did not arrive in time; listening again", "attempt", late, "retry", wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, listenRetryMax)
	}
}

// listenOnce runs one listener connection until it fails or ctx ends. It
// returns when it began to listen (zero if it never did).
func (c *Client) listenOnce(ctx context.Context) (began time.Time, err error) {
	conn, err := c.hijack(ctx)
	if err != nil {
		return began, err
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, sqlListen); err != nil {
		return began, dbError("listener: LISTEN", err)
	}
	if err := c.probe(ctx, conn); err != nil {
		if errors.Is(err, errNoNotifications) {
			// Best effort: behind a pooler this runs on some server
			// session, most likely the one that LISTENed (PgBouncer
			// reuses the last released first). A subscription left
			// behind is harmless: PgBouncer 1.18 drains what reaches an
			// idle server session (the backend does not block on it
			// and the notification queue does not grow).
			uctx, cancel := context.WithTimeout(ctx, time.Second)
			_, _ = conn.Exec(uctx, sqlUnlisten)
			cancel()
		}
		return began, err
	}
	iconn, err := c.hijack(ctx)
	if err != nil {
		return began, err
	}
	defer closeConn(iconn)
	wctx, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	if err := c.startInterest(ctx, iconn, lost); err != nil {
		return began, err
	}
	defer c.stopInterest()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		c.watchInterest(wctx, iconn, lost)
	}()
	defer func() { lost(nil); <-watched }() // before stopInterest
	c.setListening(true)
	began = time.Now()
	c.log.Debug("leases: listening for releases; waking waiters, renewing held leases", "held", c.wakeAll())
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			switch {
			case errors.Is(err, context.Canceled) && ctx.Err() != nil:
				return began, nil
			case wctx.Err() != nil:
				return began, context.Cause(wctx) // errInterestLost
			}
			return began, dbError("listener: wait for notification", err)
		}
		c.notified(n)
	}
}

// hijack takes a connection out of the pool for the listener's own use.
func (c *Client) hijack(ctx context.Context) (*pgx.Conn, error) {
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, dbError("listener: acquire connection", err)
	}
	return pc.Hijack(), nil
}

// closeConn closes a hijacked connection, bounded by a second.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

func (c *Client) setListening(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listenOK = ok
	if ok {
		select {
		case <-c.hooks.listening:
		default:
			close(c.hooks.listening)
		}
	}
}

// probe proves that notifications reach conn, which has just LISTENed: it
// sends a probe on the channel from another connection of the pool and
// waits for it, handling the notifications that arrive meanwhile. It
// returns errNoNotifications if the probe does not arrive within
// probeTimeout of being sent, and another error if it could not be sent or
// conn failed.
func (c *Client) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := probePayload()
	sctx, cancel := context.WithTimeout(ctx, probeSendTimeout)
	_, err := c.pool.Exec(sctx, sqlProbe, notifyChannel, payload)
	cancel()
	if err != nil {
		return dbError("listener: send probe notification", err)
	}
	wctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return fmt.Errorf("leases: listener: wait for probe notification: %w", ctx.Err())
		case wctx.Err() != nil && !conn.IsClosed():
			return errNoNotifications
		default:
			return dbError("listener: wait for probe notification", err)
		}
		if n.Channel == notifyChannel && n.Payload == payload {
			if c.hooks.lateProbes > 0 {
				c.hooks.lateProbes--
				continue
			}
			return nil
		}
		c.notified(n)
	}
}

// notified wakes whoever waits for the released lease. Probes (this
// client's or another's) name no lease and are ignored.
func (c *Client) notified(n *pgconn.Notification) {
	if n.Channel != notifyChannel || isProbe(n.Payload) {
		return
	}
	c.wakeName(n.Payload)
}

// wakeName wakes the head waiter and the observers of name, and has the
// keepalive check the lease now if this client holds it.
func (c *Client) wakeName(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recheckLocked(name)
	for _, key := range []string{name, semQueue(name)} {
		if q := c.queues[key]; q != nil && len(q.waiters) > 0 {
			signal(q.waiters[0].wake)
		}
	}
	for o := range c.observers[name] {
		signal(o.wake)
	}
}

// wakeAll wakes every head waiter and every observer, and has the
// keepalive renew every held lease now (in its batch): a force-release or
// a hand-over request made while nothing listened notified nobody, and
// the renewal finds it. It returns how many leases are held.
func (c *Client) wakeAll() (held int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.held) > 0 {
		now := time.Now()
		for _, l := range c.held {
			if l.nextRenew.After(now) {
				l.nextRenew = now
			}
		}
		c.nextDue = now
		c.kickKeepalive()
	}
	for _, q := range c.queues {
		if len(q.waiters) > 0 {
			signal(q.waiters[0].wake)
		}
	}
	for _, os := range c.observers {
		for o := range os {
			signal(o.wake)
		}
	}
	return len(c.held)
}
