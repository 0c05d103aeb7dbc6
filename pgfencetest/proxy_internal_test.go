package pgfencetest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// blackhole returns the address of a loopback listener that answers no
// connection: its accept queue (backlog 0) is full with one connection
// it never accepts, so the kernel drops every further SYN, as a firewall
// that drops packets does, and a dial to it hangs until it gives up.
func blackhole(t *testing.T) (addr string, port int) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port = sa.(*syscall.SockaddrInet4).Port
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	filler, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatalf("fill the accept queue: %v", err)
	}
	t.Cleanup(func() { _ = filler.Close() })
	if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
		_ = c.Close()
		t.Fatal("the black hole answered a second connection")
	}
	return addr, port
}

// synSent says whether a socket of this machine is dialling 127.0.0.1:port
// and has had no answer (state SYN_SENT in /proc/net/tcp).
func synSent(t *testing.T, port int) bool {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		t.Errorf("read the sockets: %v", err)
		return true
	}
	defer f.Close()
	remote := fmt.Sprintf("0100007F:%04X", port)
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		fields := strings.Fields(lines.Text())
		if len(fields) > 3 && fields[2] == remote && fields[3] == "02" {
			return true
		}
	}
	return false
}

// TestProxyCleanupDuringHungDial: the test ends while the proxy is still
// dialling a target that never answers. Its cleanup returns at once
// rather than wait for the dial (the kernel gives up after about two
// minutes).
func TestProxyCleanupDuringHungDial(t *testing.T) {
	t.Parallel()
	target, port := blackhole(t)
	cleanedUp := make(chan struct{})
	go func() {
		defer close(cleanedUp)
		r := &recorder{TB: t}
		r.run(func(tb testing.TB) {
			p := NewProxy(tb, target)
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				tb.Errorf("connect to the proxy: %v", err)
				return
			}
			defer c.Close()
			if !pgtest.Poll(30*time.Second, func() bool { return synSent(t, port) }) {
				tb.Errorf("the proxy did not dial the target within 30s")
			}
		})
		if r.fatal != "" || len(r.errors) > 0 {
			t.Errorf("%s %q", r.fatal, r.errors)
		}
	}()
	select {
	case <-cleanedUp:
	case <-time.After(60 * time.Second):
		t.Fatal("the proxy's cleanup has not returned 60s after the test ended: it waits for a dial to a target that never answers")
	}
}

// TestProxyDialTimesOut: a connection through a proxy whose target never
// answers is closed once the proxy's dial times out, rather than left
// open for as long as the kernel keeps trying.
func TestProxyDialTimesOut(t *testing.T) {
	t.Parallel()
	target, _ := blackhole(t)
	p := newProxy(t, target, 100*time.Millisecond)
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read through a proxy whose dial timed out: %d bytes, %v; want the connection closed", n, err)
	}
}
