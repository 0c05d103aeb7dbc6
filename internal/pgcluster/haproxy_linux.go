package pgcluster

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// haproxy is HAProxy in TCP mode in front of a Patroni cluster's nodes,
// listening on a free loopback port and sending each new connection to the
// one node whose Patroni REST API answers GET /primary with 200: the
// leader, running as a primary. It checks every 300ms, marks a node down
// after two failed checks and then closes the connections it forwarded
// there (on-marked-down shutdown-sessions), as the Patroni documentation's
// HAProxy template does.
type haproxy struct {
	*daemon
	port int
}

// haproxyBackend is one server line: the node's PostgreSQL address and its
// REST API port.
type haproxyBackend struct {
	name, host string
	pgPort     int
	apiPort    int
}

// startHAProxy starts HAProxy under dir and waits until it listens.
func startHAProxy(dir string, backends []haproxyBackend) (*haproxy, error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil {
			return nil, errors.New("pgcluster: haproxy not found on PATH or at /usr/sbin/haproxy (apt-get install -y haproxy)")
		}
		bin = "/usr/sbin/haproxy"
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, `global
    maxconn 1000
defaults
    mode tcp
    timeout connect 2s
    timeout client 30m
    timeout server 30m
    timeout check 1s
listen primary
    bind 127.0.0.1:%d
    option httpchk GET /primary
    http-check expect status 200
    default-server inter 300ms fall 2 rise 1 on-marked-down shutdown-sessions
`, port)
	for _, b := range backends {
		fmt.Fprintf(&cfg, "    server %s %s check port %d\n", b.name, net.JoinHostPort(b.host, strconv.Itoa(b.pgPort)), b.apiPort)
	}
	conf := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o644); err != nil {
		return nil, fmt.Errorf("pgcluster: write haproxy.cfg: %w", err)
	}
	d, err := startDaemon("haproxy", filepath.Join(dir, "haproxy.log"), nil, nil, syscall.SIGKILL, bin, "-db", "-f", conf)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := d.waitUntil(30*time.Second, func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	}); err != nil {
		d.stop(syscall.SIGKILL, 0)
		return nil, err
	}
	return &haproxy{daemon: d, port: port}, nil
}
