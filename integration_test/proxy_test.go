package integration_test

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/redact"
)

// proxy forwards TCP between a loopback listener and a PostgreSQL server,
// so that a test can partition a client from the database:
//
//   - Blackhole stops forwarding in both directions without closing any
//     socket, as a network that silently drops packets would: each side's
//     writes pile up in kernel buffers and neither side learns anything.
//     Bytes already read are held, not dropped, and Heal delivers them, as
//     TCP retransmission would once the network heals.
//   - Cut closes every forwarded connection at once (both sides), as a
//     reset or a restarted middlebox would. New connections still work.
//
// A connection opened while blackholed is accepted (the kernel does that)
// and then hears nothing, like a SYN that reached a host that answers no
// more. The proxy is closed at the end of the test.
type proxy struct {
	ln   net.Listener
	dial func(ctx context.Context) (net.Conn, error)

	mu     sync.Mutex
	open   chan struct{} // closed while forwarding; a fresh one while blackholed
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// link is one forwarded connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{}
}

func (l *link) close() {
	l.once.Do(func() {
		close(l.done)
		_ = l.client.Close()
		_ = l.server.Close()
	})
}

// startProxy starts a proxy to the server at addr (host:port).
func startProxy(t *testing.T, addr string) *proxy {
	t.Helper()
	var d net.Dialer
	return startProxyDial(t, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) })
}

// startProxyDial starts a proxy whose upstream connections come from dial,
// which is called for each accepted connection (so the upstream address
// may change, as a restarted container's mapped port does).
func startProxyDial(t *testing.T, dial func(ctx context.Context) (net.Conn, error)) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy: listen: %v", err)
	}
	open := make(chan struct{})
	close(open)
	p := &proxy{ln: ln, dial: dial, open: open, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's listening address, host:port.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// proxyTo starts a proxy to the server of pool (startProxy).
func proxyTo(t *testing.T, pool *pgxpool.Pool) *proxy {
	t.Helper()
	cfg := pool.Config().ConnConfig
	return startProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
}

// URL returns databaseURL with its host and port replaced by the proxy's.
func (p *proxy) URL(t *testing.T, databaseURL string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("proxy: parse the database URL: %v", redact.ErrorFor(err, databaseURL))
	}
	u.Host = p.Addr()
	return u.String()
}

// Blackhole stops forwarding; see proxy.
func (p *proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default: // already blackholed
	}
}

// Heal resumes forwarding, delivering what was held.
func (p *proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// Cut closes every connection forwarded so far.
func (p *proxy) Cut() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Conns is the number of connections currently forwarded.
func (p *proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Close stops listening, cuts every connection and waits for the proxy's
// goroutines to exit. Safe to call twice.
func (p *proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *proxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := p.dial(ctx)
		cancel()
		if err != nil {
			_ = c.Close() // upstream down: the client sees a closed connection
			continue
		}
		l := &link{client: c, server: s, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			return
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pump(l, c, s)
		go p.pump(l, s, c)
	}
}

// pump copies src to dst, holding data while the proxy is blackholed. The
// end of either direction (EOF, error) ends the link, also only once the
// proxy forwards again: a partition hides a FIN as it hides data.
func (p *proxy) pump(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32*1024)
	for {
		n, rerr := src.Read(buf)
		select {
		case <-p.gate():
		case <-l.done:
			return
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				l.close()
				return
			}
		}
		if rerr != nil { // EOF or error: either way this connection is over
			l.close()
			return
		}
	}
}

// TestProxy checks the proxy itself against PostgreSQL: it forwards,
// Blackhole silences a connection without closing it, Heal lets new
// connections through, and Cut closes what it forwards.
func TestProxy(t *testing.T) {
	t.Parallel()
	u := setup(t)
	p := startProxy(t, hostPort(t, u))
	ctx := ctxT(t, time.Minute)
	connect := func() *pgx.Conn {
		t.Helper()
		c, err := pgx.Connect(ctx, p.URL(t, u))
		if err != nil {
			t.Fatalf("connect through the proxy: %v", err)
		}
		t.Cleanup(func() { _ = c.Close(context.Background()) })
		return c
	}
	c := connect()
	if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("query through the proxy: %v", err)
	}

	p.Blackhole()
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := c.Exec(qctx, "SELECT 1")
	cancel()
	if err == nil {
		t.Fatal("a query through a blackholed proxy answered")
	}
	if p.Conns() == 0 {
		t.Error("Blackhole closed the forwarded connection")
	}

	p.Heal()
	c2 := connect()
	if _, err := c2.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatalf("query after Heal: %v", err)
	}
	p.Cut()
	if _, err := c2.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("a query on a cut connection answered")
	}
	if _, err := connect().Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("a new connection after Cut: %v", err)
	}
}
