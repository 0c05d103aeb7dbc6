package main

import (
	"net"
	"net/url"
	"sync"
	"testing"
)

// silentProxy forwards TCP from a loopback port to a PostgreSQL server
// until Silence: from then on it forwards nothing in either direction and
// closes nothing, as a network that drops every packet would. Neither side
// learns anything; their writes pile up in kernel buffers.
type silentProxy struct {
	ln      net.Listener
	silence chan struct{} // closed by Silence

	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	once   sync.Once
	wg     sync.WaitGroup
}

// startSilentProxy forwards to the host and port of databaseURL and returns
// the proxy and the URL that goes through it. It is closed when t ends.
func startSilentProxy(t *testing.T, databaseURL string) (*silentProxy, string) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{ln: ln, silence: make(chan struct{})}
	target := u.Host
	p.wg.Go(func() { p.accept(target) })
	t.Cleanup(p.close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

// Silence stops all forwarding for good. Safe to call twice.
func (p *silentProxy) Silence() { p.once.Do(func() { close(p.silence) }) }

func (p *silentProxy) accept(target string) {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_, _ = client.Close(), server.Close()
			return
		}
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Go(func() { p.pump(server, client) })
		p.wg.Go(func() { p.pump(client, server) })
	}
}

// pump copies src to dst; once silenced it stops reading, so that nothing
// more is forwarded and no end of stream is passed on.
func (p *silentProxy) pump(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.silence:
			return
		default:
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *silentProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
