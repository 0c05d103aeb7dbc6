package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
)

// LostAnswers loses, once armed, the answer to the next statement sent
// whose text holds a given string: when the first row of the server's
// answer to it arrives, the connection closes and the read fails, as when
// the network breaks after the server committed (the server sends a row
// this small with ReadyForQuery, after the commit of the statement's
// implicit transaction). A prepare's answer has no row, so the statement
// is found by its text whether it is sent with it or prepared first. Give
// its Dial to a connection config (pgconn.Config.DialFunc); the
// connections must not be encrypted, or no text is seen.
type LostAnswers struct {
	mu    sync.Mutex
	match []byte
	lost  chan struct{}
}

// ReleaseCall, armed, loses the answer to a lease's Release, and to no
// other statement: the keepalive's pgfence.release_many, which ends the
// grant of a release that failed (once more, though its answer was only
// lost) and may be sent late on a loaded machine, holds "pgfence.release"
// too, and took the answer a test meant to lose.
const ReleaseCall = "pgfence.release("

// Arm loses the answer to the next statement holding match; the channel is
// closed once that answer is lost.
func (a *LostAnswers) Arm(match string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.match, a.lost = []byte(match), make(chan struct{})
	return a.lost
}

// MustHaveLost fails t unless the answer lost stands for (Arm's channel)
// was lost by now: the premise of a test that loses one.
func MustHaveLost(t testing.TB, lost <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-lost:
	default:
		t.Fatalf("the answer to %s was not lost (the premise of this test)", what)
	}
}

// Dial dials as net.Dialer does, with the connection's statements and
// answers watched.
func (a *LostAnswers) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := new(net.Dialer).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &losingConn{Conn: c, a: a}, nil
}

// A losingConn is a connection LostAnswers watches. A client (pgx, lib/pq)
// writes a request and then reads its answer, never both at once; mu
// guards the state the two sides share all the same.
type losingConn struct {
	net.Conn
	a *LostAnswers

	mu    sync.Mutex
	lost  chan struct{} // armed: the statement was sent here; closed when its answer is lost
	since []byte        // what was read since it was sent, from a message's start
}

func (c *losingConn) Write(b []byte) (int, error) {
	c.a.mu.Lock()
	if c.a.match != nil && bytes.Contains(b, c.a.match) {
		c.mu.Lock()
		c.lost, c.since = c.a.lost, nil
		c.mu.Unlock()
		c.a.match = nil
	}
	c.a.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *losingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lost == nil || n == 0 {
		return n, err
	}
	// A message is a type byte and a length that counts itself; look for
	// a DataRow ('D') among those begun since the statement was sent.
	c.since = append(c.since, b[:n]...)
	for len(c.since) >= 5 {
		if c.since[0] == 'D' {
			_ = c.Conn.Close() // the fault itself: the answer never arrives
			close(c.lost)
			c.lost, c.since = nil, nil
			return 0, io.ErrUnexpectedEOF
		}
		size := 1 + int(binary.BigEndian.Uint32(c.since[1:5]))
		if len(c.since) < size {
			break
		}
		c.since = c.since[size:]
	}
	return n, err
}
