package pgtest

import (
	"bytes"
	"context"
	"net"
	"sync"
	"time"
)

// LateWrites delays, once armed, the next write to the server that holds
// a given text: a statement held up on the network. Give its Dial to a
// connection config (pgconn.Config.DialFunc); the connections must not be
// encrypted, or no text is seen.
type LateWrites struct {
	mu      sync.Mutex
	match   []byte
	delay   time.Duration
	sending chan struct{}
}

// Arm delays the next write holding match by d; the channel is closed when
// that write begins.
func (w *LateWrites) Arm(match string, d time.Duration) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.match, w.delay, w.sending = []byte(match), d, make(chan struct{})
	return w.sending
}

// CancelWhenSent arms w (see Arm) and calls cancel once that write
// begins, or after 10s if none does; the channel then says whether it
// began.
func (w *LateWrites) CancelWhenSent(match string, d time.Duration, cancel context.CancelFunc) <-chan bool {
	sending := w.Arm(match, d)
	seen := make(chan bool, 1)
	go func() {
		defer cancel()
		select {
		case <-sending:
			seen <- true
		case <-time.After(10 * time.Second):
			seen <- false
		}
	}()
	return seen
}

// Dial dials as net.Dialer does, with the connection's writes watched.
func (w *LateWrites) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := new(net.Dialer).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &lateConn{Conn: c, w: w}, nil
}

type lateConn struct {
	net.Conn
	w *LateWrites
}

func (c *lateConn) Write(b []byte) (int, error) {
	c.w.mu.Lock()
	var d time.Duration
	if c.w.match != nil && bytes.Contains(b, c.w.match) {
		d = c.w.delay
		close(c.w.sending)
		c.w.match = nil
	}
	c.w.mu.Unlock()
	time.Sleep(d) // the fault itself: the bytes are late on the wire
	return c.Conn.Write(b)
}
