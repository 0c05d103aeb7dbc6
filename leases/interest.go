package leases

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// A release sends a notification only when someone waits for the lease or
// observes it (pgfence.notify_waiters): a transaction that notifies
// serialises its commit with every other notifying transaction, which
// halves release throughput under load even when nobody listens. Whoever
// waits says so by holding the name's wait key — an advisory lock, shared —
// on a second dedicated connection of the listener, the interest
// connection, for as long as the name has waiters or observers in this
// client. The release tests the key with an exclusive try.
//
// Ordering makes it safe. The head waiter takes the key before its first
// attempt, so a release either precedes the attempt (which then sees the
// lease free) or finds the key held and notifies. Keys are tried, never
// waited for: one held exclusively — by a release, for the instant of its
// commit, or by any role for as long as it likes — must not hold up the
// registrations of other names, which share the interest connection. A
// waiter or observer whose key is taken by someone else is not
// registered: it polls, from 50ms backing off to the poll interval, and
// tries the key again before each attempt. The listener tries the keys of
// every wanted name whenever it (re)connects and then wakes every waiter,
// as it did before. Without a listener nothing is taken: waiters poll.
// Keys are dropped lazily, by a goroutine, once a name has neither
// waiters nor observers; a key held a little too long costs a spurious
// notification, nothing more.

// interest is the interest connection and the wait keys held on it.
type interest struct {
	conn *pgx.Conn           // nil while no listener runs
	held map[string]struct{} // names whose wait key conn holds
	// lost ends the listener's connection too, so that the listener
	// starts again with a new pair: a closed interest connection holds
	// no key, and no release would notify this client any more.
	lost context.CancelCauseFunc
}

// errInterestLost ends a listener whose interest connection closed.
var errInterestLost = errors.New("leases: listener: the interest connection closed")

// waitKey is the second int4 of name's wait key: the high 32 bits of
// pglock.Key(name), as pgfence.wait_key computes it.
func waitKey(name string) int32 {
	sum := sha256.Sum256([]byte(name))
	return int32(binary.BigEndian.Uint32(sum[:4]))
}

// wantedLocked reports whether name has waiters or observers. c.mu held.
func (c *Client) wantedLocked(name string) bool {
	return c.queues[name] != nil || c.queues[semQueue(name)] != nil || len(c.observers[name]) > 0
}

// want takes name's wait key if a listener runs and it is not yet held,
// and reports whether a release of name will notify this client: false
// when the key is taken by someone else, or the statement failed; the
// caller then polls (backoff). If it closed the interest connection (the
// caller's ctx ended during the statement: pgx closes the connection),
// the listener starts again and re-registers every name when it has
// reconnected. Without a listener it reports true: pollDelay knows.
func (c *Client) want(ctx context.Context, name string) bool {
	ok, err := c.wantKey(ctx, name)
	if !ok {
		// Logged once c.imu is released: a log handler that stalls must
		// not hold up the other waiters' registrations.
		c.log.Debug("leases: could not register as waiter; polling", "name", name, "err", err)
	}
	return ok
}

// errKeyTaken is why want did not register a name whose wait key another
// session holds exclusively.
var errKeyTaken = errors.New("leases: wait key held exclusively by another session")

// wantKey is want, holding c.imu.
func (c *Client) wantKey(ctx context.Context, name string) (bool, error) {
	c.imu.Lock()
	defer c.imu.Unlock()
	if c.in.conn == nil {
		return true, nil
	}
	if _, ok := c.in.held[name]; ok {
		return true, nil
	}
	ctx, cancel := context.WithTimeout(ctx, interestTimeout)
	defer cancel()
	missed, err := tryKeys(ctx, c.in.conn, []int32{waitKey(name)})
	if err != nil {
		if c.in.conn.IsClosed() {
			c.in.lost(errInterestLost)
		}
		return false, err
	}
	if len(missed) > 0 {
		return false, errKeyTaken
	}
	c.in.held[name] = struct{}{}
	return true, nil
}

// tryKeys tries the wait keys keys on conn, without waiting, and returns
// those another session holds exclusively.
func tryKeys(ctx context.Context, conn *pgx.Conn, keys []int32) ([]int32, error) {
	rows, err := conn.Query(ctx, sqlWantTry, keys)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int32])
}

// unwantLater drops name's wait key in the background once nobody in this
// client waits for or observes it.
func (c *Client) unwantLater(name string) {
	c.mu.Lock()
	if c.isClosed() {
		c.mu.Unlock()
		return
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		c.imu.Lock()
		defer c.imu.Unlock()
		if _, ok := c.in.held[name]; !ok || c.in.conn == nil {
			return
		}
		c.mu.Lock()
		wanted := c.wantedLocked(name)
		c.mu.Unlock()
		if wanted {
			return
		}
		ctx, cancel := context.WithTimeout(c.shutdown, interestTimeout)
		defer cancel()
		if _, err := c.in.conn.Exec(ctx, sqlUnwant, []int32{waitKey(name)}); err != nil {
			if c.in.conn.IsClosed() {
				c.in.lost(errInterestLost) // the listener replaces it
			}
			return
		}
		delete(c.in.held, name)
	}()
}

// startInterest installs conn as the interest connection and takes the
// wait keys of every wanted name on it; lost ends the listener. The
// listener calls it after LISTEN succeeded, before it wakes everyone.
func (c *Client) startInterest(ctx context.Context, conn *pgx.Conn, lost context.CancelCauseFunc) error {
	c.imu.Lock()
	defer c.imu.Unlock()
	c.mu.Lock()
	wanted := make(map[string]struct{}, len(c.queues)+len(c.observers))
	for key := range c.queues {
		wanted[queueName(key)] = struct{}{}
	}
	for name := range c.observers {
		wanted[name] = struct{}{}
	}
	c.mu.Unlock()
	names := make([]string, 0, len(wanted))
	for name := range wanted {
		names = append(names, name)
	}
	keys := make([]int32, len(names))
	for i, name := range names {
		keys[i] = waitKey(name)
	}
	// Tried, not waited for (see the top of this file): a name whose key
	// was not taken is left out of held, and its waiters and observers
	// try it again before their next attempt. Only that name is slowed.
	missed, err := tryKeys(ctx, conn, keys)
	if err != nil {
		return dbError("listener: register waiters", err)
	}
	c.in.conn = conn
	c.in.lost = lost
	c.in.held = make(map[string]struct{}, len(names))
	for i, name := range names {
		if !slices.Contains(missed, keys[i]) {
			c.in.held[name] = struct{}{}
		}
	}
	return nil
}

// interestCheck is how often the listener checks that the interest
// connection is still open. Nothing else reads it: without the check, a
// backend that ends while the client waits (pg_terminate_backend,
// idle_session_timeout) would drop every wait key unnoticed, releases
// would stop notifying, and waiters would sleep until their poll.
const interestCheck = time.Second

// watchInterest checks, every interestCheck until ctx ends, that conn,
// the interest connection, has not been closed by its server, and ends
// the listener (lost) if it has. A check reads the connection with a
// deadline already due, under c.imu: a message of a backend that ended
// (the FATAL error, end of file) is there at once, so the check costs no
// round trip.
func (c *Client) watchInterest(ctx context.Context, conn *pgx.Conn, lost context.CancelCauseFunc) {
	t := time.NewTicker(interestCheck)
	defer t.Stop()
	nc := conn.PgConn().Conn()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.imu.Lock()
		if c.in.conn != conn {
			c.imu.Unlock()
			return
		}
		// A deadline of its own rather than a context: a pool that
		// cancels with a cancel request would send one per check.
		_ = nc.SetReadDeadline(time.Now().Add(time.Millisecond))
		_ = conn.PgConn().WaitForNotification(context.Background())
		_ = nc.SetReadDeadline(time.Time{})
		closed := conn.IsClosed()
		c.imu.Unlock()
		if closed {
			lost(errInterestLost)
			return
		}
	}
}

// stopInterest forgets the interest connection; its owner closes it, which
// drops every wait key.
func (c *Client) stopInterest() {
	c.imu.Lock()
	defer c.imu.Unlock()
	c.in.conn = nil
	c.in.held = nil
	c.in.lost = nil
}

// interestTimeout bounds one statement on the interest connection.
const interestTimeout = 5 * time.Second
