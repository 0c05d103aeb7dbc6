package pgfencetest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// Proxy forwards TCP from a loopback port to a PostgreSQL server, so that
// a test can cut a process under test off from the database: start the
// process with ProxyURL's URL, then Cut and Restore. It belongs to the test
// that made it and is closed, with its connections, when the test ends.
//
// Each connection it accepts, it forwards over a new connection to the
// target, dialled within 10s; when that fails, it closes the
// accepted connection, as an unreachable server would look to the
// process.
type Proxy struct {
	ln          net.Listener
	target      string
	dialTimeout time.Duration
	wg          sync.WaitGroup // the accept loop and every forwarding goroutine

	// stop ends the dials in flight when the proxy is closed.
	stopped context.Context
	stop    context.CancelFunc

	mu     sync.Mutex
	cut    bool
	closed bool
	conns  map[net.Conn]struct{}
}

// proxyDialTimeout bounds a Proxy's dial to its target.
const proxyDialTimeout = 10 * time.Second

// NewProxy starts a proxy to target (host:port) on a free loopback port. It
// fails t if target is not host:port.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return newProxy(t, target, proxyDialTimeout)
}

func newProxy(t testing.TB, target string, dialTimeout time.Duration) *Proxy {
	t.Helper()
	if host, port, err := net.SplitHostPort(target); err != nil || host == "" || port == "" {
		t.Fatalf("pgfencetest: NewProxy: the target must be host:port, got %q", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgfencetest: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, dialTimeout: dialTimeout, conns: map[net.Conn]struct{}{}}
	p.stopped, p.stop = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// ProxyURL starts a proxy to the server databaseURL points at and returns
// databaseURL rewritten to go through it. databaseURL is a connection
// string in URL or keyword/value form (what URL returns, whichever form
// PGFENCE_TEST_DATABASE_URL has), naming one TCP host; ProxyURL fails t
// for anything else, and for an empty string (which pgx would read as
// "the defaults").
func ProxyURL(t testing.TB, databaseURL string) (*Proxy, string) {
	t.Helper()
	if strings.TrimSpace(databaseURL) == "" {
		t.Fatalf("pgfencetest: ProxyURL: the connection string is empty")
	}
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		// pgconn's message may quote the string, password and all.
		t.Fatalf("pgfencetest: ProxyURL: the connection string cannot be parsed (its text is not repeated here: it may hold a password)")
	}
	if strings.HasPrefix(cfg.Host, "/") {
		t.Fatalf("pgfencetest: ProxyURL needs a TCP host, got the Unix socket directory %s", cfg.Host)
	}
	for _, fb := range cfg.Fallbacks {
		if fb.Host != cfg.Host || fb.Port != cfg.Port {
			t.Fatalf("pgfencetest: ProxyURL needs one host, got %s:%d and %s:%d", cfg.Host, cfg.Port, fb.Host, fb.Port)
		}
	}
	p := NewProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatalf("pgfencetest: proxy address %s: %v", p.Addr(), err)
	}
	if !strings.HasPrefix(databaseURL, "postgres://") && !strings.HasPrefix(databaseURL, "postgresql://") {
		// Keyword/value: a later keyword overrides an earlier one.
		return p, databaseURL + " host=" + host + " port=" + port
	}
	u, err := url.Parse(databaseURL)
	if err != nil {
		t.Fatalf("pgfencetest: ProxyURL: the connection string cannot be parsed (its text is not repeated here: it may hold a password)")
	}
	u.Host = p.Addr()
	// A host or port among the parameters would override the URL's.
	q := u.Query()
	q.Del("host")
	q.Del("port")
	u.RawQuery = q.Encode()
	return p, u.String()
}

// Addr is the proxy's host:port on 127.0.0.1.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every forwarded connection at once, and closes new ones as
// soon as they are accepted, until Restore: the process behind the proxy
// sees its connections reset and cannot reconnect, as in a partition.
// Safe to repeat.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore forwards new connections again. Safe to repeat.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(c) {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c)
	}
}

// track records c unless the proxy is cut or closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
	_ = c.Close()
}

// forward copies between client and a new connection to the target until
// either side ends or the proxy cuts them.
func (p *Proxy) forward(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	ctx, cancel := context.WithTimeout(p.stopped, p.dialTimeout)
	var d net.Dialer
	server, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		return
	}
	if !p.track(server) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.stop()
	_ = p.ln.Close()
	p.wg.Wait()
}

// CutContainerNetwork disconnects the container id (name or ID) from every
// network it is attached to, so that it can reach nothing and nothing can
// reach it. The returned function reconnects it, with the same endpoint
// settings (aliases, addresses), to every one of those networks it is no
// longer on; it is safe to call more than once, and runs when t ends if
// the test has not called it. It fails t if id is empty, no Docker engine
// answers or a disconnect fails; the networks already cut are reconnected
// when t ends all the same.
func CutContainerNetwork(t testing.TB, id string) (restore func()) {
	t.Helper()
	return cutNetwork(t, id, func(f func(context.Context, networkAPI) error) error {
		return withDocker(func(ctx context.Context, cli *testcontainers.DockerClient) error { return f(ctx, cli) })
	})
}

// networkAPI is what CutContainerNetwork asks of the Docker engine.
type networkAPI interface {
	ContainerInspect(context.Context, string, client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	NetworkDisconnect(context.Context, string, client.NetworkDisconnectOptions) (client.NetworkDisconnectResult, error)
	NetworkConnect(context.Context, string, client.NetworkConnectOptions) (client.NetworkConnectResult, error)
}

// cutNetwork is CutContainerNetwork with the engine given by docker.
func cutNetwork(t testing.TB, id string, docker func(func(context.Context, networkAPI) error) error) (restore func()) {
	t.Helper()
	if id == "" {
		t.Fatalf("pgfencetest: CutContainerNetwork: the container ID is empty")
	}
	var saved map[string]*network.EndpointSettings
	// Registered before the first disconnect, so that a failure part-way
	// (or a disconnect that failed on the client but happened on the
	// engine) leaves nothing cut once t ends.
	restore = once(t, func() error {
		if len(saved) == 0 {
			return nil
		}
		return docker(func(ctx context.Context, cli networkAPI) error {
			res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
			if err != nil {
				return fmt.Errorf("reconnect container %s: %w", id, err)
			}
			var now map[string]*network.EndpointSettings
			if res.Container.NetworkSettings != nil {
				now = res.Container.NetworkSettings.Networks
			}
			for name, ep := range saved {
				if _, ok := now[name]; ok {
					continue
				}
				settings := &network.EndpointSettings{Aliases: ep.Aliases, IPAMConfig: ep.IPAMConfig, Links: ep.Links}
				if _, err := cli.NetworkConnect(ctx, name, client.NetworkConnectOptions{Container: id, EndpointConfig: settings}); err != nil {
					return fmt.Errorf("reconnect container %s to %s: %w", id, name, err)
				}
			}
			return nil
		})
	})
	err := docker(func(ctx context.Context, cli networkAPI) error {
		res, err := cli.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
		if err != nil {
			return err
		}
		if res.Container.NetworkSettings != nil {
			saved = res.Container.NetworkSettings.Networks
		}
		for name := range saved {
			if _, err := cli.NetworkDisconnect(ctx, name, client.NetworkDisconnectOptions{Container: id, Force: true}); err != nil {
				return fmt.Errorf("disconnect from %s: %w", name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pgfencetest: cut the network of container %s: %v", id, err)
	}
	return restore
}
