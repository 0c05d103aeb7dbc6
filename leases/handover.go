package leases

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Graceful hand-over (River's RequestResign): an operator asks the holder
// of a lease to step down, for a rolling deploy, say. The request
// (pgfence.request_handover) marks the current grant — by its fence, so a
// later grant is never affected — and notifies. The holder's keepalive
// learns of it at its next renewal, which a notification brings forward to
// about a round trip when the holder's client listens (Lead's does;
// otherwise within TTL/3). The holder's Context then ends with cause
// ErrHandover, but the lease stays held and renewed until the holder
// releases it: Run and Lead release as soon as fn returns, and a waiter on
// any replica, woken by the release, takes over within a round trip. So,
// unlike ForceRelease, nobody else holds the lease while the old holder's
// work may still run. A holder that does not release is reported
// (ErrHandoverTimeout), never forced.

// handoverLocked ends l's context with cause ErrHandover, once, when a
// renewal reported a hand-over request, and reports whether it did; the
// caller then logs it (steppingDown) once c.mu is released. c.mu held.
func (c *Client) handoverLocked(l *Lease) bool {
	if l.handover || l.state != stateHeld {
		return false
	}
	l.handover = true
	l.cancel(fmt.Errorf("leases: lease %q (fence %d): %w", l.name, l.fence, ErrHandover))
	return true
}

// steppingDown logs that l's holder was asked to hand it over. Never
// under c.mu: a log handler that stalls must not hold up the keepalive's
// bookkeeping nor the deadlines of the other leases.
func (c *Client) steppingDown(l *Lease) {
	c.log.Info("leases: hand-over requested; stepping down", "name", l.name, "owner", l.owner, "fence", l.fence)
}

// RequestHandover asks the current holder of the named lease to hand it
// over, and waits until it has: until the grant it asked is no longer the
// lease's grant (released, and perhaps already taken by a waiter). It
// returns that grant. If nobody holds the lease it returns ErrNotHeld. If
// the grant is still there after timeout, it returns an error wrapping
// ErrHandoverTimeout naming the holder, which keeps the lease: nothing is
// forced (ForceRelease is the break-glass). If ctx ends first, the wait is
// cut short: the error names the holder, which held the lease when the wait
// ended and keeps it, and wraps ctx's error (context.Cause), not
// ErrHandoverTimeout. Either way the request stays recorded for that grant,
// so the holder may still step down later; calling again repeats it. Needs
// pgfence_operator (pgfence.request_handover).
func (c *Client) RequestHandover(ctx context.Context, name string, timeout time.Duration) (Info, error) {
	if err := validateName(name); err != nil {
		return Info{}, err
	}
	if err := c.usable(ctx); err != nil {
		return Info{}, err
	}
	if timeout <= 0 || timeout > time.Hour {
		return Info{}, invalid(fmt.Sprintf("leases: hand-over timeout must be between 1ns and 1h, got %s", timeout))
	}
	if err := c.checkEncoding(ctx, "hand-over of", name); err != nil {
		return Info{}, err
	}
	ctx, span := c.tr.Start(ctx, spanHandover, name, 0)
	asked, err := c.requestHandover(ctx, name, timeout)
	span.End(asked.Fence, err)
	return asked, err
}

func (c *Client) requestHandover(ctx context.Context, name string, timeout time.Duration) (Info, error) {
	asked := Info{Name: name}
	err := c.q.QueryRow(ctx, sqlRequestHandover, name).Scan(&asked.Owner, &asked.Fence)
	if errors.Is(err, errNoRows) {
		return Info{Name: name}, fmt.Errorf("leases: hand-over of %q: %w", name, ErrNotHeld)
	}
	if err != nil {
		return Info{Name: name}, dbError(fmt.Sprintf("hand-over of %q", name), err)
	}
	c.log.Info("leases: hand-over requested", "name", name, "owner", asked.Owner, "fence", asked.Fence)
	begin := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// An Observe refused because ctx or the timeout already ended (or the
	// client closed) is the wait's end like any other: the holder was asked
	// and still holds the lease, which the errors below say.
	switch ch, err := c.Observe(wctx, name); {
	case err == nil:
		for info := range ch {
			if info.Fence != asked.Fence {
				cancel()
				for range ch {
				}
				return asked, nil
			}
		}
	case wctx.Err() == nil && !c.isClosed():
		return asked, err
	}
	switch {
	case c.isClosed():
		return asked, fmt.Errorf("leases: hand-over of %q: %w", name, ErrClosed)
	case ctx.Err() != nil:
		return asked, fmt.Errorf("leases: hand-over of %q: wait cut short after %s, with %q (fence %d) still holding it: %w",
			name, time.Since(begin).Round(time.Millisecond), asked.Owner, asked.Fence, context.Cause(ctx))
	}
	return asked, fmt.Errorf("leases: hand-over of %q: %q (fence %d) still holds it after %s: %w",
		name, asked.Owner, asked.Fence, timeout, ErrHandoverTimeout)
}
