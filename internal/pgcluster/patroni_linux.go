package pgcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Patroni is a highly available PostgreSQL cluster as its users run it:
// one etcd (v3 API) holding Patroni's leader key, PostgreSQL nodes each
// managed by its own Patroni, and HAProxy routing to whichever node
// Patroni's REST API reports as the primary. Each node runs in a network
// namespace of its own (see Isolate); etcd and HAProxy run in this
// process's namespace, which reaches every node.
//
// Timings are short, for tests: ttl 8s, loop_wait 1s, retry_timeout 3s
// (Patroni requires ttl >= loop_wait + 2*retry_timeout), and
// primary_start_timeout 0, so a crashed primary fails over at once instead
// of being restarted in place (if a replica is within
// maximum_lag_on_failover: see WithMaximumLagOnFailover). fsync is off.
// Every node trusts every connection; the superuser is postgres.
//
// NewPatroni needs root (namespaces), and patroni, etcd and haproxy
// installed (Debian: patroni, etcd-server, haproxy). The caller owns the
// cluster and must Close it.
type Patroni struct {
	dir     string
	scope   string
	lab     *netLab
	etcd    *etcd
	haproxy *haproxy
	nodes   []*PatroniNode
	sync    bool
	pgBin   string
}

// PatroniOption configures NewPatroni.
type PatroniOption func(*patroniConfig)

type patroniConfig struct {
	nodes       int
	sync        bool
	maxLag      int64
	params      map[string]string
	startupWait time.Duration
}

// WithPatroniNodes sets the number of PostgreSQL nodes. Default 3; at
// least 1.
func WithPatroniNodes(n int) PatroniOption { return func(c *patroniConfig) { c.nodes = n } }

// WithSynchronousMode turns Patroni's synchronous_mode on: the primary
// acknowledges a commit only once a synchronous standby has flushed it, and
// Patroni promotes only that standby. Default off (asynchronous
// replication).
func WithSynchronousMode(on bool) PatroniOption { return func(c *patroniConfig) { c.sync = on } }

// WithMaximumLagOnFailover sets Patroni's maximum_lag_on_failover in bytes:
// a replica further behind the last known primary position than this is
// never promoted. Default 1 MiB (Patroni's own default).
func WithMaximumLagOnFailover(bytes int64) PatroniOption {
	return func(c *patroniConfig) { c.maxLag = bytes }
}

// WithPatroniParameter sets a PostgreSQL parameter on every node (in the
// cluster-wide configuration Patroni keeps in etcd).
func WithPatroniParameter(name, value string) PatroniOption {
	return func(c *patroniConfig) { c.params[name] = value }
}

// apiClient calls Patroni's and etcd's HTTP APIs. It keeps no idle
// connections, and gives up dialling a node that does not answer (cut off
// by Isolate) after a second, so no goroutine of it outlives a call by
// more than that.
var apiClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true, DialContext: (&net.Dialer{Timeout: time.Second}).DialContext},
	Timeout:   3 * time.Second,
}

// PatroniNode is one PostgreSQL server and its Patroni.
type PatroniNode struct {
	name    string
	host    *nsHost
	dir     string
	cfgPath string
	cred    *syscall.Credential
	patroni string // binary

	mu sync.Mutex
	d  *daemon
}

const (
	patroniPGPort  = 15432 // each node has its own namespace, so every node uses the same ports
	patroniAPIPort = 18008
	patroniTTL     = 8 * time.Second
)

// NewPatroni starts etcd, the nodes and HAProxy, and returns once there is
// a leader and every other node is a streaming replica with no lag.
func NewPatroni(opts ...PatroniOption) (_ *Patroni, err error) {
	cfg := patroniConfig{nodes: 3, maxLag: 1 << 20, params: map[string]string{}, startupWait: 90 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.nodes < 1 {
		return nil, fmt.Errorf("pgcluster: a Patroni cluster needs at least 1 node, got %d", cfg.nodes)
	}
	if cfg.maxLag < 0 {
		return nil, fmt.Errorf("pgcluster: maximum_lag_on_failover must not be negative, got %d", cfg.maxLag)
	}
	bin, err := exec.LookPath("patroni")
	if err != nil {
		return nil, errors.New("pgcluster: patroni not found on PATH (apt-get install -y patroni)")
	}
	pgBin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	// Patroni wants every server program (pg_controldata, pg_rewind, …)
	// in bin_dir: the installation's own directory, not a directory of
	// symlinks to initdb and postgres.
	if real, err := filepath.EvalSymlinks(filepath.Join(pgBin, "postgres")); err == nil {
		pgBin = filepath.Dir(real)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-patroni-*")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: patroni directory: %w", err)
	}
	// Patroni runs as the server user, which must reach its node's
	// directory under this one.
	if err := os.Chmod(dir, 0o755); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: patroni directory: %w", err)
	}
	p := &Patroni{dir: dir, scope: "pgfence-" + filepath.Base(dir), sync: cfg.sync, pgBin: pgBin}
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	if p.lab, err = newNetLab(cfg.nodes); err != nil {
		return nil, err
	}
	if p.etcd, err = startEtcd(dir, p.lab.gateway()); err != nil {
		return nil, err
	}
	var backends []haproxyBackend
	for i, h := range p.lab.hosts {
		n := &PatroniNode{name: fmt.Sprintf("node%d", i+1), host: h, dir: filepath.Join(dir, fmt.Sprintf("node%d", i+1)), cred: cred, patroni: bin}
		if err := n.writeConfig(p, pgBin, cfg); err != nil {
			return nil, err
		}
		p.nodes = append(p.nodes, n)
		backends = append(backends, haproxyBackend{name: n.name, host: h.addr, pgPort: patroniPGPort, apiPort: patroniAPIPort})
	}
	// The first node bootstraps alone, so that it wins the initialize
	// race without contention; the others then clone it.
	if err := p.nodes[0].Start(); err != nil {
		return nil, err
	}
	if err := p.waitFor(cfg.startupWait, "a leader", func(ms []PatroniMember) bool {
		for _, m := range ms {
			if m.IsLeader() && m.State == "running" {
				return true
			}
		}
		return false
	}); err != nil {
		return nil, err
	}
	for _, n := range p.nodes[1:] {
		if err := n.Start(); err != nil {
			return nil, err
		}
	}
	if p.haproxy, err = startHAProxy(dir, backends); err != nil {
		return nil, err
	}
	if err := p.WaitHealthy(cfg.startupWait); err != nil {
		return nil, err
	}
	return p, nil
}

func (n *PatroniNode) writeConfig(p *Patroni, pgBin string, cfg patroniConfig) error {
	if err := os.MkdirAll(n.dir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: node directory: %w", err)
	}
	api := net.JoinHostPort(n.host.addr, strconv.Itoa(patroniAPIPort))
	pg := net.JoinHostPort(n.host.addr, strconv.Itoa(patroniPGPort))
	dcsParams := map[string]any{
		"max_connections":    200,
		"wal_log_hints":      "on",
		"wal_keep_size":      "128MB",
		"max_wal_senders":    10,
		"hot_standby":        "on",
		"synchronous_commit": "on",
	}
	for k, v := range cfg.params {
		dcsParams[k] = v
	}
	ttl := int(patroniTTL / time.Second)
	conf := map[string]any{
		"scope":     p.scope,
		"namespace": "/pgfence/",
		"name":      n.name,
		"log":       map[string]any{"level": "INFO"},
		"restapi":   map[string]any{"listen": api, "connect_address": api},
		"etcd3":     map[string]any{"hosts": []string{p.etcd.endpoint}, "protocol": "http"},
		"bootstrap": map[string]any{
			"dcs": map[string]any{
				"ttl": ttl, "loop_wait": 1, "retry_timeout": 3,
				"maximum_lag_on_failover": cfg.maxLag,
				"primary_start_timeout":   0,
				"synchronous_mode":        cfg.sync,
				"postgresql": map[string]any{
					"use_pg_rewind": true,
					"use_slots":     true,
					"parameters":    dcsParams,
				},
			},
			"initdb": []any{map[string]any{"encoding": "UTF8"}, map[string]any{"locale": "C"}, "no-sync"},
		},
		"postgresql": map[string]any{
			"listen":          pg,
			"connect_address": pg,
			"data_dir":        n.DataDir(),
			"bin_dir":         pgBin,
			"pgpass":          filepath.Join(n.dir, "pgpass"),
			"use_unix_socket": true,
			"authentication": map[string]any{
				"superuser":   map[string]any{"username": "postgres", "password": "pgfence"},
				"replication": map[string]any{"username": "replicator", "password": "pgfence"},
				"rewind":      map[string]any{"username": "postgres", "password": "pgfence"},
			},
			"parameters": map[string]any{
				"unix_socket_directories": n.dir,
				"fsync":                   "off",
				"logging_collector":       "off",
			},
			"pg_hba": []string{
				"local all all trust",
				"host all all 0.0.0.0/0 trust",
				"host replication all 0.0.0.0/0 trust",
			},
			// A spread checkpoint would hold pg_basebackup for minutes.
			"basebackup": []any{map[string]any{"checkpoint": "fast"}},
			"remove_data_directory_on_rewind_failure":     true,
			"remove_data_directory_on_diverged_timelines": true,
		},
	}
	// JSON is YAML: Patroni reads it as its configuration file.
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	n.cfgPath = filepath.Join(n.dir, "patroni.yml")
	if err := os.WriteFile(n.cfgPath, b, 0o600); err != nil {
		return fmt.Errorf("pgcluster: write %s: %w", n.cfgPath, err)
	}
	if n.cred != nil {
		for _, f := range []string{n.dir, n.cfgPath} {
			if err := os.Chown(f, int(n.cred.Uid), int(n.cred.Gid)); err != nil {
				return fmt.Errorf("pgcluster: hand %s to uid %d: %w", f, n.cred.Uid, err)
			}
		}
	}
	return nil
}

// Tool is the path of one of the server's programs (pg_waldump, …), from
// the installation the nodes run.
func (p *Patroni) Tool(name string) string { return filepath.Join(p.pgBin, name) }

// Nodes are the cluster's nodes, in a fixed order (node1, node2, …).
func (p *Patroni) Nodes() []*PatroniNode { return p.nodes }

// Node returns the node called name, or nil.
func (p *Patroni) Node(name string) *PatroniNode {
	for _, n := range p.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// URL is a multi-host connection URL over every node for database dbname,
// with target_session_attrs=read-write: libpq and pgx try the nodes in
// order and keep the first that accepts writes. connect_timeout is 2s per
// host, so an unreachable node costs at most that.
func (p *Patroni) URL(dbname string) string {
	hosts := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		hosts[i] = n.hostPort()
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		strings.Join(hosts, ","), url.PathEscape(dbname))
}

// HAProxyURL is a connection URL for database dbname through HAProxy,
// which forwards to the current primary.
func (p *Patroni) HAProxyURL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", p.haproxy.port, url.PathEscape(dbname))
}

// PatroniMember is one member as Patroni's GET /cluster reports it.
type PatroniMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"`  // leader, replica, sync_standby, standby_leader
	State    string `json:"state"` // running, streaming, starting, stopped, …
	Timeline int    `json:"timeline"`
	Lag      any    `json:"lag"` // bytes, or "unknown"
}

// IsLeader reports whether the member holds the leader key.
func (m PatroniMember) IsLeader() bool {
	return m.Role == "leader" || m.Role == "master" || m.Role == "primary"
}

// caughtUp reports whether a replica streams with no lag.
func (m PatroniMember) caughtUp() bool {
	lag, ok := m.Lag.(float64)
	return (m.State == "running" || m.State == "streaming") && ok && lag == 0
}

// Members asks the nodes this process can reach, in order, for Patroni's
// view of the cluster, and returns the first answer.
func (p *Patroni) Members(ctx context.Context) ([]PatroniMember, error) {
	var errs []error
	for _, n := range p.nodes {
		var out struct {
			Members []PatroniMember `json:"members"`
		}
		// A node cut off by Isolate does not answer at all: give each
		// node its own second rather than letting it use up ctx.
		nctx, cancel := context.WithTimeout(ctx, time.Second)
		err := n.api(nctx, http.MethodGet, "/cluster", nil, &out)
		cancel()
		if err == nil {
			return out.Members, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("pgcluster: no node answered GET /cluster: %w", errors.Join(errs...))
}

// Leader is the node holding the leader key, as the reachable nodes see it;
// nil when there is none.
func (p *Patroni) Leader(ctx context.Context) (*PatroniNode, error) {
	ms, err := p.Members(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.IsLeader() {
			return p.Node(m.Name), nil
		}
	}
	return nil, nil
}

// WaitHealthy waits until every node is a member, one is the running
// leader and every other a replica that has caught up.
func (p *Patroni) WaitHealthy(timeout time.Duration) error {
	return p.waitFor(timeout, "a healthy cluster", func(ms []PatroniMember) bool {
		if len(ms) != len(p.nodes) {
			return false
		}
		leaders := 0
		for _, m := range ms {
			switch {
			case m.IsLeader():
				if m.State != "running" {
					return false
				}
				leaders++
			case !m.caughtUp():
				return false
			}
		}
		if leaders != 1 {
			return false
		}
		return !p.sync || hasSyncStandby(ms)
	})
}

func hasSyncStandby(ms []PatroniMember) bool {
	for _, m := range ms {
		if m.Role == "sync_standby" {
			return true
		}
	}
	return false
}

// WaitLeader waits until a leader other than the nodes in not is running,
// and returns it.
func (p *Patroni) WaitLeader(timeout time.Duration, not ...*PatroniNode) (*PatroniNode, error) {
	var leader *PatroniNode
	err := p.waitFor(timeout, "a new leader", func(ms []PatroniMember) bool {
		for _, m := range ms {
			if m.IsLeader() && m.State == "running" {
				n := p.Node(m.Name)
				for _, x := range not {
					if x == n {
						return false
					}
				}
				leader = n
				return true
			}
		}
		return false
	})
	return leader, err
}

func (p *Patroni) waitFor(timeout time.Duration, what string, ok func([]PatroniMember) bool) error {
	deadline := time.Now().Add(timeout)
	var last []PatroniMember
	var lastErr error
	for time.Now().Before(deadline) {
		if !p.anyRunning() {
			return fmt.Errorf("pgcluster: waiting for %s: no Patroni is running\n%s", what, p.Logs(3000))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ms, err := p.Members(ctx)
		cancel()
		if err == nil {
			if ok(ms) {
				return nil
			}
			last = ms
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond) // poll Patroni: it announces nothing
	}
	return fmt.Errorf("pgcluster: no %s within %v: members %+v (last error %v)\n%s", what, timeout, last, lastErr, p.Logs(2000))
}

func (p *Patroni) anyRunning() bool {
	for _, n := range p.nodes {
		n.mu.Lock()
		up := n.d != nil && n.d.running()
		n.mu.Unlock()
		if up {
			return true
		}
	}
	return false
}

// Switchover runs patronictl switchover from the current leader to
// candidate (a planned, clean hand-over) and waits until candidate leads.
func (p *Patroni) Switchover(ctx context.Context, candidate *PatroniNode) error {
	leader, err := p.Leader(ctx)
	if err != nil {
		return err
	}
	if leader == nil {
		return errors.New("pgcluster: switchover: no leader")
	}
	out, err := exec.CommandContext(ctx, "patronictl", "-c", p.nodes[0].cfgPath, "switchover", p.scope,
		"--leader", leader.name, "--candidate", candidate.name, "--force").CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgcluster: patronictl switchover: %w\n%s", err, out)
	}
	d, _ := ctx.Deadline()
	if _, err := p.WaitLeader(time.Until(d), leader); err != nil {
		return err
	}
	return nil
}

// Logs is the tail of every daemon's log, for failure messages.
func (p *Patroni) Logs(n int) string {
	var b strings.Builder
	for _, nd := range p.nodes {
		nd.mu.Lock()
		if nd.d != nil {
			fmt.Fprintf(&b, "--- %s (patroni and postgres)\n%s\n", nd.name, nd.d.logTail(n))
		}
		nd.mu.Unlock()
	}
	if p.etcd != nil {
		fmt.Fprintf(&b, "--- etcd\n%s\n", p.etcd.logTail(n/2))
	}
	return b.String()
}

// Close stops HAProxy, every node and etcd, removes the namespaces and the
// cluster's directory. Safe to call twice.
func (p *Patroni) Close() error {
	if p.haproxy != nil {
		p.haproxy.stop(syscall.SIGKILL, 0)
	}
	for _, n := range p.nodes {
		n.stopHard()
	}
	if p.lab != nil {
		p.lab.Close() // anything left in the namespaces
	}
	if p.etcd != nil {
		p.etcd.stop(syscall.SIGKILL, 0)
	}
	return os.RemoveAll(p.dir)
}

// Name is the node's Patroni name (node1, node2, …).
func (n *PatroniNode) Name() string { return n.name }

// DataDir is the node's PostgreSQL data directory.
func (n *PatroniNode) DataDir() string { return filepath.Join(n.dir, "data") }

func (n *PatroniNode) hostPort() string {
	return net.JoinHostPort(n.host.addr, strconv.Itoa(patroniPGPort))
}

// URL is a connection URL to this node's PostgreSQL alone, for dbname.
func (n *PatroniNode) URL(dbname string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&connect_timeout=2", n.hostPort(), url.PathEscape(dbname))
}

// Start starts the node's Patroni (which starts PostgreSQL: as a replica
// unless it bootstraps the cluster or wins the leader race). It returns
// once Patroni's REST API answers.
func (n *PatroniNode) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.d != nil && n.d.running() {
		return fmt.Errorf("pgcluster: %s already running", n.name)
	}
	d, err := startDaemon("patroni "+n.name, filepath.Join(n.dir, "patroni.log"), n.host, n.cred, syscall.SIGTERM, n.patroni, n.cfgPath)
	if err != nil {
		return err
	}
	n.d = d
	return d.waitUntil(60*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return n.api(ctx, http.MethodGet, "/patroni", nil, nil)
	})
}

// Kill SIGKILLs Patroni and every PostgreSQL process of the node, as a
// machine crash would, and waits until they are gone. Start brings the node
// back (it rejoins, rewinding if it must).
func (n *PatroniNode) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.d != nil {
		_ = n.d.cmd.Process.Signal(syscall.SIGKILL)
		<-n.d.exit
	}
	n.host.killAll()
}

// KillPostgres SIGKILLs the node's postmaster and its children, leaving
// Patroni running.
func (n *PatroniNode) KillPostgres() error {
	pid, err := n.PostmasterPid()
	if err != nil {
		return err
	}
	children := childPids(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, c := range children {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	return waitGone(append(children, pid))
}

// PostmasterPid reads the running postmaster's pid from postmaster.pid.
func (n *PatroniNode) PostmasterPid() (int, error) {
	b, err := os.ReadFile(filepath.Join(n.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %s: %w", n.name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		return 0, fmt.Errorf("pgcluster: %s: postmaster.pid: %w", n.name, err)
	}
	return pid, nil
}

// Isolate cuts the node off from everything outside its namespace: etcd,
// the other nodes, HAProxy and this process's clients. Patroni and
// PostgreSQL keep running; clients dialled with Dial still reach it.
func (n *PatroniNode) Isolate() error { return n.host.isolate() }

// Heal undoes Isolate.
func (n *PatroniNode) Heal() error { return n.host.heal() }

// Dial connects from inside the node's namespace, as a client on the
// node's side of a partition would; use it as pgconn.Config.DialFunc with
// the node's own URL.
func (n *PatroniNode) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return n.host.dial(ctx, network, addr)
}

// stopHard stops Patroni with SIGKILL and kills what is left in the
// namespace.
func (n *PatroniNode) stopHard() {
	n.mu.Lock()
	d := n.d
	n.mu.Unlock()
	if d != nil {
		d.stop(syscall.SIGKILL, 0)
	}
	n.host.killAll()
}

// api calls the node's REST API and decodes a JSON answer into out (if
// not nil). A non-2xx status is an error.
func (n *PatroniNode) api(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+net.JoinHostPort(n.host.addr, strconv.Itoa(patroniAPIPort))+path, rd)
	if err != nil {
		return err
	}
	resp, err := apiClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("pgcluster: %s %s on %s: %s: %s", method, path, n.name, resp.Status, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
