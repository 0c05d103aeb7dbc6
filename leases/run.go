package leases

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Run acquires the named lease (waiting, like Acquire), runs fn with a
// context that ends when ctx ends or the lease is no longer safely held
// (whichever first; the cause says which), then releases the lease, also
// when fn panics (the panic goes on once the lease is released), bounded
// by WithReleaseTimeout (default 5s) and not by ctx's cancellation. It
// returns Acquire's error, or fn's error; if the lease was lost while fn
// ran, the returned error wraps ErrLost (also when fn returned nil). On a
// hand-over request fn's context ends with cause ErrHandover and Run
// releases once fn returns; fn's error reporting its context's end
// (context.Canceled) is returned wrapping ErrHandover too.
// opts configure the grant (WithData). fn must stop its work when its
// context ends: after that, another owner may hold the lease.
func (c *Client) Run(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context, l *Lease) error, opts ...AcquireOption) error {
	if fn == nil {
		return invalid("leases: fn must not be nil")
	}
	l, err := c.Acquire(ctx, name, ttl, opts...)
	if err != nil {
		return err
	}
	return c.runHeld(ctx, l, fn)
}

// runHeld runs fn under l and releases l afterwards, also when fn panics
// (the panic goes on once l is released).
func (c *Client) runHeld(ctx context.Context, l *Lease, fn func(ctx context.Context, l *Lease) error) error {
	_, err := c.runHeldLost(ctx, l, fn)
	return err
}

// runHeldLost is runHeld, also saying whether l itself was lost: its hold
// ended with ErrLost, or its release found the grant gone. fn's error
// wrapping ErrLost (of another lease fn used, say) does not say that.
func (c *Client) runHeldLost(ctx context.Context, l *Lease, fn func(ctx context.Context, l *Lease) error) (lost bool, err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(context.Cause(l.ctx)) })
	defer func() {
		stop()
		if err != nil && ctx.Err() == nil && errors.Is(err, context.Canceled) && !errors.Is(err, ErrHandover) {
			// fn reported its context ending: say why, when an operator
			// asked for the lease (a loss is named by afterRun).
			if cause := context.Cause(fctx); errors.Is(cause, ErrHandover) {
				err = fmt.Errorf("%w (%w)", err, cause)
			}
		}
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.releaseTimeout)
		defer rcancel()
		lost = errors.Is(l.Err(), ErrLost)
		relErr := l.Release(rctx)
		lost = lost || errors.Is(relErr, ErrLost)
		err = c.afterRun(l, err, relErr)
	}()
	return false, fn(fctx, l)
}

// afterRun combines fn's error with the Release that followed it.
func (c *Client) afterRun(l *Lease, fnErr, relErr error) error {
	switch {
	case errors.Is(relErr, ErrLost):
		if fnErr == nil || errors.Is(fnErr, ErrLost) {
			if fnErr != nil {
				return fnErr
			}
			return relErr
		}
		return fmt.Errorf("%w (and %w)", fnErr, relErr)
	case relErr != nil:
		c.log.Warn("leases: release after run failed", "name", l.name, "fence", l.fence, "err", relErr)
	}
	return fnErr
}

// Lead is leader election on the named lease. It campaigns (Acquire),
// runs fn while leader with a context that ends when leadership ends, and
// when leadership is lost campaigns again — until ctx ends, when it
// releases the lease if leader and returns nil. If fn returns while still
// leader (nil or an error), Lead releases and returns fn's result (wrapping
// ErrLost if the release finds that the lease was lost meanwhile); if fn
// panics, Lead releases and the panic goes on. Database errors while
// campaigning are logged and retried with backoff; bad input (also a name
// or data the database's encoding cannot hold: a data exception), a
// missing schema or a closed client are returned. At most one fn runs at a
// time per lease name across all clients (as judged by PostgreSQL), as long
// as fn honours its context. When an operator requests a hand-over
// (RequestHandover), fn's context ends with cause ErrHandover; once fn
// returns, Lead releases — a waiting candidate takes over within a round
// trip — and campaigns again only after one TTL (a request that arrives
// once fn has returned does not count: Lead returns fn's result). opts
// configure each grant (WithData: a leader's address, say).
func (c *Client) Lead(ctx context.Context, name string, ttl time.Duration, fn func(ctx context.Context, l *Lease) error, opts ...AcquireOption) error {
	if fn == nil {
		return invalid("leases: fn must not be nil")
	}
	if err := validate(name, ttl); err != nil {
		return err
	}
	if _, err := acquireOptions(opts); err != nil {
		return err
	}
	if err := c.usable(ctx); err != nil {
		return err
	}
	// The listener wakes the campaign when the leader releases, and makes
	// a force-released leader check its lease at once.
	c.startListener()
	backoff := 100 * time.Millisecond
	for {
		l, err := c.Acquire(ctx, name, ttl, opts...)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil
			case permanent(err):
				return err
			}
			d := jitter(backoff)
			backoff = min(backoff*2, c.cfg.pollInterval)
			c.log.Warn("leases: campaign failed; retrying", "name", name, "err", err, "retry", d)
			if stop, err := c.pause(ctx, d); stop {
				return err
			}
			continue
		}
		backoff = 100 * time.Millisecond
		c.log.Info("leases: became leader", "name", name, "owner", l.owner, "fence", l.fence)
		// A hand-over request counts if it ended fn's context before fn
		// returned: one that lands while Lead releases after fn returned
		// finds the leader stepping down anyway, and must not turn fn's
		// result into a hand-over (and fn into a new campaign).
		// Likewise a loss counts if it was known when fn returned: one
		// that Release finds afterwards came after fn had finished as
		// leader, as far as it could tell; Lead returns fn's result then,
		// wrapping ErrLost, rather than running fn again.
		var handedOver, lostWhileRunning bool
		err = c.lead(ctx, l, func(ctx context.Context, l *Lease) error {
			defer func() {
				handedOver = errors.Is(context.Cause(l.ctx), ErrHandover)
				lostWhileRunning = errors.Is(l.Err(), ErrLost)
			}()
			return fn(ctx, l)
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case handedOver && !c.isClosed():
			// Stepped down on request: leave the lease to the other
			// candidates, woken by the release, for a TTL before
			// campaigning again.
			c.log.Info("leases: handed leadership over; campaigning again after a TTL", "name", name, "fence", l.fence, "err", err)
			if stop, err := c.pause(ctx, ttl); stop {
				return err
			}
		case lostWhileRunning:
			c.log.Warn("leases: leadership lost; campaigning again", "name", name, "fence", l.fence, "err", err)
		case c.isClosed():
			return ErrClosed
		default:
			return err
		}
	}
}

// lead runs fn under l, counted as leading name while it runs (also if
// fn panics).
func (c *Client) lead(ctx context.Context, l *Lease, fn func(ctx context.Context, l *Lease) error) error {
	c.setLeading(l.name, 1)
	defer c.setLeading(l.name, -1)
	return c.runHeld(ctx, l, fn)
}

// pause waits d between Lead's campaigns. stop says that Lead ends: with
// nil when ctx ended, with ErrClosed when the client closed.
func (c *Client) pause(ctx context.Context, d time.Duration) (stop bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		return true, nil
	case <-c.shutdown.Done():
		return true, ErrClosed
	}
}
