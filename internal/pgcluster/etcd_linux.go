package pgcluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// etcd is a one-member etcd (v3 API) for Patroni's leader key, listening
// for clients on addr:port, with fsync off: a test's consensus store.
type etcd struct {
	*daemon
	endpoint string // host:port
}

// startEtcd starts etcd under dir, serving clients on host (this process's
// namespace) at a free port, and waits until it reports itself healthy.
func startEtcd(dir, host string) (*etcd, error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return nil, errors.New("pgcluster: etcd not found on PATH (apt-get install -y etcd-server)")
	}
	clientPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	client := "http://" + net.JoinHostPort(host, strconv.Itoa(clientPort))
	peer := "http://127.0.0.1:" + strconv.Itoa(peerPort)
	d, err := startDaemon("etcd", filepath.Join(dir, "etcd.log"), nil, nil, syscall.SIGKILL, bin,
		"--name", "pgfence", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "pgfence="+peer,
		"--unsafe-no-fsync", "--logger", "zap", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	e := &etcd{daemon: d, endpoint: net.JoinHostPort(host, strconv.Itoa(clientPort))}
	if err := d.waitUntil(30*time.Second, func() error {
		resp, err := apiClient.Get(client + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), `"health":"true"`) {
			return fmt.Errorf("etcd /health: %s", b)
		}
		return nil
	}); err != nil {
		d.stop(syscall.SIGKILL, 0)
		return nil, err
	}
	return e, nil
}
