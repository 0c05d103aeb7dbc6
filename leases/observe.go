package leases

import (
	"bytes"
	"context"
	"errors"
	"time"
)

type observer struct {
	wake chan struct{} // buffered 1; sent without blocking
}

// Observe reports who holds the named lease. The channel first receives
// the current grant, then every change of holder (a new owner or fence)
// or of the holder's data (Lease.SetData):
// releases and force-releases within about a round trip (notifications),
// other changes — expiries, grants — within the poll interval or at the
// holder's expiry. An Info with an empty Owner (and zero Fence) means
// nobody holds the lease. Values are not queued: the channel holds at most
// one, the latest state read, which replaces one not yet received, so a
// slow reader sees the latest state, not every intermediate one. The
// channel is closed, and the goroutine behind it exits, when ctx ends or
// the client closes. Database errors are logged and retried at the poll
// interval.
func (c *Client) Observe(ctx context.Context, name string) (<-chan Info, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	if err := c.usable(ctx); err != nil {
		return nil, err
	}
	if err := c.checkEncoding(ctx, "observe", name); err != nil {
		return nil, err
	}
	o := &observer{wake: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if c.observers[name] == nil {
		c.observers[name] = make(map[*observer]struct{})
	}
	c.observers[name][o] = struct{}{}
	c.wg.Add(1)
	c.mu.Unlock()
	c.startListener()

	ch := make(chan Info, 1)
	octx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.shutdown, cancel)
	go func() {
		defer c.wg.Done()
		defer close(ch)
		defer func() {
			stop()
			cancel()
			c.mu.Lock()
			delete(c.observers[name], o)
			last := len(c.observers[name]) == 0
			if last {
				delete(c.observers, name)
			}
			c.mu.Unlock()
			if last {
				c.unwantLater(name)
			}
		}()
		c.observe(octx, name, o, ch)
	}()
	return ch, nil
}

func (c *Client) observe(ctx context.Context, name string, o *observer, ch chan Info) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var last Info
	first := true
	missed := 0 // reads in a row made without the wait key (want)
	for {
		delay := jitter(c.cfg.pollInterval)
		if c.want(ctx, name) { // before the read: see interest.go
			missed = 0
		} else {
			delay = min(delay, jitter(backoff(missed)))
			missed++
		}
		info, remaining, err := c.get(ctx, name)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil || errors.Is(err, ErrNotHeld):
			if err == nil {
				delay = min(delay, remaining+time.Millisecond)
			}
			if first || info.Owner != last.Owner || info.Fence != last.Fence || !bytes.Equal(info.Data, last.Data) {
				// A value the reader has not taken yet is stale now:
				// replace it. This goroutine is the only sender, so the
				// send finds room and never blocks.
				select {
				case <-ch:
				default:
				}
				ch <- info
				first, last = false, info
			}
		default:
			c.log.Warn("leases: observe: read failed; retrying", "name", name, "err", err)
		}
		timer.Reset(delay)
		select {
		case <-o.wake:
		case <-timer.C:
		case <-ctx.Done():
			return
		}
	}
}
