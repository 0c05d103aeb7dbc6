package pglock

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// proxy forwards TCP connections to a target, and can be switched to a
// blackhole: it keeps every connection open but stops forwarding bytes in
// both directions, like a network that silently drops packets. Tests use it
// to reproduce a silent network without touching the server.
type proxy struct {
	ln        net.Listener
	target    string
	blackhole atomic.Bool
	refuse    atomic.Bool

	mu     sync.Mutex
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

// startProxy listens on a loopback port and forwards to target; it is
// closed when t ends (Close is safe to call earlier).
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// proxyTo starts a proxy (startProxy) to the server pool connects to.
func proxyTo(t testing.TB, pool *pgxpool.Pool) *proxy {
	t.Helper()
	cfg := pool.Config().ConnConfig
	return startProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
}

// route makes the connections of cfg go through p.
func (p *proxy) route(cfg *pgxpool.Config) {
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = "127.0.0.1", p.Port(), nil
}

// Port returns the port the proxy listens on.
func (p *proxy) Port() uint16 { return uint16(p.ln.Addr().(*net.TCPAddr).Port) }

// Blackhole stops all forwarding, now and for new connections, without
// closing anything: reads keep draining and dropping what arrives.
func (p *proxy) Blackhole() { p.blackhole.Store(true) }

// RefuseNew makes the proxy close every new connection at once, while
// existing ones keep working: a cancel request (which pgx sends on a new
// connection) is lost.
func (p *proxy) RefuseNew() { p.refuse.Store(true) }

// Close closes the listener and every connection, and waits for the
// proxy's goroutines to return. It is safe to call more than once.
func (p *proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		_ = p.ln.Close()
		for _, c := range p.conns {
			_ = c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track records c so that Close closes it; it reports false (and closes c)
// when the proxy is already closed.
func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(client) {
			return
		}
		if p.refuse.Load() {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(server) {
			return
		}
		p.wg.Go(func() { p.pipe(server, client) })
		p.wg.Go(func() { p.pipe(client, server) })
	}
}

// pipe copies src to dst until src fails. While the proxy is a blackhole it
// drops what it reads, and a failed src does not close dst: silence, not a
// reset.
func (p *proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if !p.blackhole.Load() {
				_ = dst.Close() // pass the close (or reset) on
				_ = src.Close()
			}
			return
		}
	}
}
