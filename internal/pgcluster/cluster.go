// Package pgcluster runs throwaway PostgreSQL clusters from the server
// binaries on the machine: a private data directory, a free loopback port,
// trust authentication for the superuser postgres. Tests reach it through
// internal/pgtest; `pgfence demo` uses it directly when no database is
// configured. It imports nothing test-only, so the command stays small.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Cluster is a throwaway PostgreSQL cluster run from the machine's binaries:
// its own data directory, its own loopback port, its superuser "postgres"
// with trust authentication. The test that started it may Stop, Kill and
// Start it again; it is removed at the test's cleanup.
type Cluster struct {
	bin      string // directory holding initdb and postgres
	dir      string // temporary root; data directory is dir/data
	port     int
	settings map[string]string
	cred     *syscall.Credential

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has exited
}

// Option configures New.
type Option func(*clusterConfig)

type clusterConfig struct {
	settings map[string]string
}

// WithSetting sets a server parameter (postgres -c name=value), for example
// WithSetting("idle_session_timeout", "1s").
func WithSetting(name, value string) Option {
	return func(c *clusterConfig) { c.settings[name] = value }
}

// New initialises and starts a throwaway cluster. The caller owns it and
// must Close it; the postmaster also shuts down if the calling process dies
// (it is started with a parent-death signal). New fails when no PostgreSQL
// binaries are found on PATH or under /usr/lib/postgresql/*/bin, or when the
// server does not start.
func New(opts ...Option) (*Cluster, error) {
	return newCluster(opts...)
}

func newCluster(opts ...Option) (*Cluster, error) {
	cfg := clusterConfig{settings: map[string]string{}}
	for _, o := range opts {
		o(&cfg)
	}
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-cluster-*")
	if err != nil {
		return nil, fmt.Errorf("make data directory: %w", err)
	}
	c := &Cluster{bin: bin, dir: dir, settings: cfg.settings, cred: cred}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("hand data directory to uid %d: %w", cred.Uid, err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"),
		"-D", c.DataDir(), "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--no-locale", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}
	if err := c.Start(); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// DataDir is the cluster's data directory.
func (c *Cluster) DataDir() string { return filepath.Join(c.dir, "data") }

// Port is the loopback TCP port the cluster listens on. It stays the same
// across Stop and Start.
func (c *Cluster) Port() int { return c.port }

// URL is a connection URL for database dbname ("postgres" always exists) as
// the superuser postgres.
func (c *Cluster) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, dbname)
}

// Start starts the server and waits until it accepts connections. The first
// Start picks a free port; later ones reuse it.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("pgcluster: cluster already running")
	}
	if c.port != 0 {
		return c.startOnce() // keep the address clients know
	}
	var err error
	for attempt := 0; attempt < 3; attempt++ { // a free port can be taken before postgres binds it
		if c.port, err = freePort(); err != nil {
			return err
		}
		if err = c.startOnce(); err == nil {
			return nil
		}
	}
	c.port = 0
	return err
}

func (c *Cluster) startOnce() error {
	args := []string{"-D", c.DataDir(), "-p", strconv.Itoa(c.port), "-k", c.dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "logging_collector=off"}
	keys := make([]string, 0, len(c.settings))
	for k := range c.settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+c.settings[k])
	}
	logf, err := os.OpenFile(filepath.Join(c.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open server log: %w", err)
	}
	cmd := exec.Command(filepath.Join(c.bin, "postgres"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: c.cred,
		Setpgid:    true,
		// If the test process dies, the postmaster shuts down immediately
		// instead of outliving it.
		Pdeathsig: syscall.SIGQUIT,
	}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close()
		close(exit)
	}()
	c.cmd, c.exit = cmd, exit

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		conn, err := pgconn.Connect(ctx, c.URL("postgres"))
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		select {
		case <-exit:
			c.cmd, c.exit = nil, nil
			return fmt.Errorf("postgres exited during start-up: %s", c.logTail())
		case <-ctx.Done():
			c.stopLocked(syscall.SIGQUIT)
			return fmt.Errorf("postgres did not accept connections within 60s: %w\n%s", err, c.logTail())
		case <-time.After(20 * time.Millisecond): // poll until the server answers
		}
	}
}

// Stop shuts the server down in the given mode — "smart", "fast" or
// "immediate", as pg_ctl stop -m — and waits for the postmaster to exit.
func (c *Cluster) Stop(mode string) error {
	sig, ok := map[string]syscall.Signal{"smart": syscall.SIGTERM, "fast": syscall.SIGINT, "immediate": syscall.SIGQUIT}[mode]
	if !ok {
		return fmt.Errorf("pgcluster: unknown shutdown mode %q (want smart, fast or immediate)", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return errors.New("pgcluster: cluster is not running")
	}
	c.stopLocked(sig)
	return nil
}

// Kill sends SIGKILL to the postmaster and every backend, as a machine crash
// would, and waits for the postmaster to exit. Start recovers from WAL.
func (c *Cluster) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return errors.New("pgcluster: cluster is not running")
	}
	pid := c.cmd.Process.Pid
	// Every PostgreSQL child makes itself a process-group leader, so
	// signalling the postmaster's group is not enough: kill each child.
	children := childPids(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, ch := range children {
		_ = syscall.Kill(ch, syscall.SIGKILL)
	}
	<-c.exit
	c.cmd, c.exit = nil, nil
	return waitGone(children)
}

// childPids lists the processes whose parent is ppid, from /proc.
func childPids(ppid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var pids []int
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain spaces and parentheses.
		rest := string(b[bytes.LastIndexByte(b, ')')+1:])
		var state string
		var parent int
		if _, err := fmt.Sscan(rest, &state, &parent); err == nil && parent == ppid {
			if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(st))); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// waitGone waits until none of pids is alive (or only a zombie): a killed
// backend that has not yet exited still holds the shared memory segment, and
// the next start would refuse to run.
func waitGone(pids []int) error {
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for alive(pid) {
			if time.Now().After(deadline) {
				return fmt.Errorf("pgcluster: server process %d still alive 10s after SIGKILL", pid)
			}
			time.Sleep(5 * time.Millisecond) // polling the kernel: there is no event to wait on
		}
	}
	return nil
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	rest := b[bytes.LastIndexByte(b, ')')+1:]
	return !bytes.HasPrefix(bytes.TrimSpace(rest), []byte("Z"))
}

// Pid is the postmaster's process id, or 0 when stopped.
func (c *Cluster) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

func (c *Cluster) stopLocked(sig syscall.Signal) {
	// The postmaster waits for its children in every shutdown mode, but a
	// child that was already dying may still be on its way out.
	children := childPids(c.cmd.Process.Pid)
	_ = c.cmd.Process.Signal(sig)
	<-c.exit
	c.cmd, c.exit = nil, nil
	_ = waitGone(children)
}

// BinDir is the directory of the PostgreSQL binaries the cluster runs.
func (c *Cluster) BinDir() string { return c.bin }

// Close stops the server immediately and removes its data directory. It is
// safe to call more than once.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.cmd != nil {
		c.stopLocked(syscall.SIGQUIT)
	}
	c.mu.Unlock()
	return os.RemoveAll(c.dir)
}

func (c *Cluster) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// findBinaries returns the directory holding initdb and postgres: PATH
// first, then the newest /usr/lib/postgresql/*/bin.
func findBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL binaries (initdb, postgres) on PATH or under /usr/lib/postgresql/*/bin")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// serverCredential returns the unprivileged user to run the server as when
// this process is root (PostgreSQL refuses to run as root), else nil.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.Atoi(u.Uid)
		gid, err2 := strconv.Atoi(u.Gid)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("running as root and found neither a postgres nor a nobody user to run the server as")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
