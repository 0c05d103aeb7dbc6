package leases

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The listener is one goroutine per Client, started the first time
// something waits or observes, stopped by Close. It takes one connection
// from the pool and hijacks it (so the pool's connect hooks apply and the
// pool opens another in its place), LISTENs on pgfence_leases, and wakes
// the head waiter and the observers of each released name. Whenever LISTEN
// (re)starts it wakes every waiter and observer, since releases may have
// gone unnoticed meanwhile. If LISTEN fails (e.g. behind a transaction-mode
// pooler), waiters poll with backoff and the listener retries every so
// often.

const (
	listenRetryMin = 500 * time.Millisecond
	listenRetryMax = 30 * time.Second
)

// startListener starts the listener goroutine once, unless notifications
// are off or the client is closing.
func (c *Client) startListener() {
	if !c.cfg.notify {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listening || c.closed {
		return
	}
	c.listening = true
	c.wg.Add(1)
	go c.listen()
}

func (c *Client) listen() {
	defer c.wg.Done()
	ctx := c.bg // cancelled when Close begins
	backoff := listenRetryMin
	for {
		err := c.listenOnce(ctx)
		c.setListening(false)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("leases: listener failed; waiters poll until it is back", "err", err, "retry", backoff)
		t := time.NewTimer(jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, listenRetryMax)
	}
}

// listenOnce runs one listener connection until it fails or ctx ends.
func (c *Client) listenOnce(ctx context.Context) error {
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return dbError("listener: acquire connection", err)
	}
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, sqlListen); err != nil {
		return dbError("listener: LISTEN", err)
	}
	c.setListening(true)
	c.wakeAll()
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return nil
			}
			return dbError("listener: wait for notification", err)
		}
		c.notified(n)
	}
}

func (c *Client) setListening(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.listenOK = ok
	if ok {
		select {
		case <-c.ready:
		default:
			close(c.ready)
		}
	}
}

// notified wakes whoever waits for the released lease.
func (c *Client) notified(n *pgconn.Notification) {
	if n.Channel != notifyChannel {
		return
	}
	c.wakeName(n.Payload)
}

// wakeName wakes the head waiter and the observers of name, and has the
// keepalive check the lease now if this client holds it.
func (c *Client) wakeName(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkHeldLocked(name)
	if q := c.queues[name]; q != nil && len(q.waiters) > 0 {
		signal(q.waiters[0].wake)
	}
	for o := range c.observers[name] {
		signal(o.wake)
	}
}

// wakeAll wakes every head waiter and every observer.
func (c *Client) wakeAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
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
}
