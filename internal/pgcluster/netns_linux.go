package pgcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A netLab is a private layer-2 network made by this process: a Linux
// bridge in a "switch" network namespace of its own, this process's
// namespace joined to it with the address <prefix>.1/24 (where etcd and
// HAProxy listen), and one network namespace per host, joined to it by a
// veth pair, with the address <prefix>.<10+i>. Hosts reach each other and
// <prefix>.1; this process reaches every host. The bridge lives in its own
// namespace so that this machine's firewall (Docker sets the FORWARD
// policy to DROP, and bridged traffic passes through it) does not apply.
// Isolate takes a host's port on the bridge down, cutting it off from
// everything outside its namespace while the processes inside keep
// running. It needs root (CAP_NET_ADMIN) and iproute2's ip.
type netLab struct {
	id     string // 6 hex digits: names the interfaces and the namespaces
	prefix string // "10.231.N"
	sw     string // the switch namespace, holding the bridge
	uplink string // this process's interface on the bridge
	hosts  []*nsHost
}

// nsHost is one network namespace of a netLab.
type nsHost struct {
	ns   string // network namespace name, under /var/run/netns
	sw   string // the switch namespace
	port string // the host's port on the bridge (in sw)
	addr string // the host's IPv4 address
}

// labMu serialises subnet choice within this process.
var labMu sync.Mutex

// labPrefix names every namespace this package makes, followed by the
// making process's pid, so that a later run can sweep what a crashed one
// left behind.
const labPrefix = "pgfence-"

// newNetLab makes the switch and hosts namespaces. The caller must Close
// it.
func newNetLab(hosts int) (lab *netLab, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("pgcluster: network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("pgcluster: ip (iproute2) not found on PATH (apt-get install -y iproute2)")
	}
	sweepNetLabs()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	id := hex.EncodeToString(b)
	name := fmt.Sprintf("%s%d-%s-", labPrefix, os.Getpid(), id)
	lab = &netLab{id: id, sw: name + "sw", uplink: "pgf" + id + "r"}
	defer func() {
		if err != nil {
			lab.Close()
		}
	}()
	labMu.Lock()
	defer labMu.Unlock()
	if lab.prefix, err = freeSubnet(); err != nil {
		return nil, err
	}
	const br = "br0"
	swPeer := "pgf" + id + "s"
	if err := ipRun("netns", "add", lab.sw); err != nil {
		return nil, err
	}
	for _, args := range [][]string{
		{"-n", lab.sw, "link", "add", br, "type", "bridge"},
		{"-n", lab.sw, "link", "set", br, "up"},
		{"link", "add", lab.uplink, "type", "veth", "peer", "name", swPeer},
		{"link", "set", swPeer, "netns", lab.sw},
		{"-n", lab.sw, "link", "set", swPeer, "master", br},
		{"-n", lab.sw, "link", "set", swPeer, "up"},
		{"addr", "add", lab.prefix + ".1/24", "dev", lab.uplink},
		{"link", "set", lab.uplink, "up"},
	} {
		if err := ipRun(args...); err != nil {
			return nil, err
		}
	}
	for i := range hosts {
		h := &nsHost{
			ns:   fmt.Sprintf("%sn%d", name, i),
			sw:   lab.sw,
			port: fmt.Sprintf("pgf%sv%d", id, i),
			addr: fmt.Sprintf("%s.%d", lab.prefix, 10+i),
		}
		lab.hosts = append(lab.hosts, h)
		peer := fmt.Sprintf("pgf%sp%d", id, i)
		for _, args := range [][]string{
			{"netns", "add", h.ns},
			{"link", "add", h.port, "type", "veth", "peer", "name", peer},
			{"link", "set", h.port, "netns", lab.sw},
			{"-n", lab.sw, "link", "set", h.port, "master", br},
			{"-n", lab.sw, "link", "set", h.port, "up"},
			{"link", "set", peer, "netns", h.ns},
			{"-n", h.ns, "link", "set", "lo", "up"},
			{"-n", h.ns, "link", "set", peer, "name", "eth0"},
			{"-n", h.ns, "addr", "add", h.addr + "/24", "dev", "eth0"},
			{"-n", h.ns, "link", "set", "eth0", "up"},
		} {
			if err := ipRun(args...); err != nil {
				return nil, err
			}
		}
	}
	return lab, nil
}

// gateway is the bridge's address, reachable from every host.
func (l *netLab) gateway() string { return l.prefix + ".1" }

// freeSubnet picks 10.231.N.0/24 with N unused by any address on this
// machine's (root) namespace.
func freeSubnet() (string, error) {
	out, err := exec.Command("ip", "-4", "-o", "addr").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgcluster: ip addr: %w\n%s", err, out)
	}
	b := make([]byte, 1)
	for range 64 {
		if _, err := rand.Read(b); err != nil {
			return "", err
		}
		p := fmt.Sprintf("10.231.%d", b[0])
		if !strings.Contains(string(out), " "+p+".") {
			return p, nil
		}
	}
	return "", errors.New("pgcluster: no free 10.231.N.0/24 subnet")
}

// Close kills every process left in the hosts' namespaces and removes the
// namespaces (which takes their veths and the bridge with them). Safe to
// call twice.
func (l *netLab) Close() {
	for _, h := range l.hosts {
		h.killAll()
		_ = ipRun("netns", "del", h.ns)
	}
	l.hosts = nil
	_ = ipRun("netns", "del", l.sw)
	_ = ipRun("link", "del", l.uplink) // normally gone with its peer already
}

// sweepNetLabs removes the namespaces of netLabs whose process is gone (it
// was killed before its cleanup ran), with every process left in them.
func sweepNetLabs() {
	entries, _ := os.ReadDir("/var/run/netns")
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), labPrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		(&nsHost{ns: e.Name()}).killAll()
		_ = ipRun("netns", "del", e.Name())
	}
}

// killAll SIGKILLs every process in the host's namespace and waits until
// they are gone.
func (h *nsHost) killAll() {
	for range 50 {
		out, _ := exec.Command("ip", "netns", "pids", h.ns).Output()
		pids := strings.Fields(strings.ReplaceAll(string(out), strconv.Itoa(os.Getpid()), ""))
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(20 * time.Millisecond) // let the kernel reap: no event to wait on
	}
}

// isolate takes the host's link down: nothing outside its namespace
// reaches it, and it reaches nothing outside.
func (h *nsHost) isolate() error { return ipRun("-n", h.sw, "link", "set", h.port, "down") }

// heal brings the host's link back up.
func (h *nsHost) heal() error { return ipRun("-n", h.sw, "link", "set", h.port, "up") }

// inNetns runs fn on an OS thread that has joined the host's network
// namespace, then moves the thread back to this process's namespace and
// hands it back to the scheduler. Threads are never ended: a process
// started by fn (or by anyone else on that thread before) gets its
// parent-death signal when the thread that forked it exits, so ending a
// thread could kill other tests' children. Only if the thread cannot move
// back is it ended, with its goroutine.
func (h *nsHost) inNetns(fn func() error) error {
	done := make(chan error, 1)
	var run func()
	run = func() {
		runtime.LockOSThread()
		if unix.Gettid() == os.Getpid() {
			// The main thread: its namespace is the whole process's in
			// /proc. Hold it so that a new goroutine lands on another
			// thread, and do the work there.
			inner := make(chan struct{})
			go func() { defer close(inner); run() }()
			<-inner
			runtime.UnlockOSThread()
			return
		}
		home, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("pgcluster: open this thread's namespace: %w", err)
			return
		}
		defer unix.Close(home)
		target, err := unix.Open(filepath.Join("/var/run/netns", h.ns), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("pgcluster: open namespace %s: %w", h.ns, err)
			return
		}
		err = unix.Setns(target, unix.CLONE_NEWNET)
		_ = unix.Close(target)
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("pgcluster: join namespace %s: %w", h.ns, err)
			return
		}
		err = fn()
		if unix.Setns(home, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and ends with this goroutine
		done <- err
	}
	go run()
	return <-done
}

// start starts cmd inside the host's namespace and returns a channel
// closed once it has exited (after cmd.Wait).
func (h *nsHost) start(cmd *exec.Cmd) (<-chan struct{}, error) {
	if err := h.inNetns(cmd.Start); err != nil {
		return nil, err
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exit)
	}()
	return exit, nil
}

// dial opens a TCP connection from inside the host's namespace: a client
// on the host's side of a partition.
func (h *nsHost) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := h.inNetns(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func ipRun(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: ip %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}
