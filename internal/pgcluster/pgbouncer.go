package pgcluster

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PoolMode is PgBouncer's pool_mode: when a server connection is handed
// back to the pool for other clients.
type PoolMode string

const (
	// SessionPooling keeps a server connection for a client's whole
	// session: everything session-scoped works (advisory locks, LISTEN,
	// prepared statements, SET).
	SessionPooling PoolMode = "session"
	// TransactionPooling hands the server connection back after every
	// transaction: consecutive statements of one client may run on
	// different server sessions.
	TransactionPooling PoolMode = "transaction"
	// StatementPooling hands the server connection back after every
	// statement, and refuses transactions that span more than one.
	StatementPooling PoolMode = "statement"
)

// PgBouncer is a PgBouncer process owned by the caller, in front of one
// PostgreSQL server, listening on a free loopback port. Clients connect
// without a password (auth_type trust); PgBouncer logs in to the server as
// the client's user, with the password of the server URL if it had one.
// Close stops it.
type PgBouncer struct {
	dir  string // temporary directory: configuration, user list, log
	port int
	user string
	mode PoolMode

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has exited
}

// BouncerOption configures NewPgBouncer.
type BouncerOption func(*bouncerConfig)

type bouncerConfig struct {
	settings map[string]string
}

// WithBouncerSetting sets a line of pgbouncer.ini's [pgbouncer] section,
// for example WithBouncerSetting("default_pool_size", "2"). It overrides
// NewPgBouncer's defaults, but not the address, authentication, pool mode
// and file locations, which NewPgBouncer fixes.
func WithBouncerSetting(name, value string) BouncerOption {
	return func(c *bouncerConfig) { c.settings[name] = value }
}

// findPgBouncer returns the pgbouncer binary: PATH first, then
// /usr/sbin/pgbouncer (where Debian's package puts it, often not on a
// user's PATH).
func findPgBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if _, err := os.Stat(debian); err == nil {
		return debian, nil
	}
	return "", errors.New("pgbouncer not found on PATH or at /usr/sbin/pgbouncer (apt-get install -y pgbouncer)")
}

// NewPgBouncer starts PgBouncer in front of the server that serverURL (a
// URL or keyword/value connection string) points at, pooling in mode, and
// waits until it accepts connections. Every database of that server is
// reachable through it (URL(dbname)). Defaults: default_pool_size 4,
// max_client_conn 500, server_round_robin 0 (the most recently used idle
// server connection is reused first: PgBouncer's default), and
// PgBouncer's own defaults otherwise; WithBouncerSetting overrides them.
//
// When this process is root, PgBouncer runs as the postgres user (or
// nobody): it refuses to run as root. It receives SIGTERM if the calling
// process dies. The caller owns it and must Close it.
func NewPgBouncer(serverURL string, mode PoolMode, opts ...BouncerOption) (*PgBouncer, error) {
	if mode != SessionPooling && mode != TransactionPooling && mode != StatementPooling {
		return nil, fmt.Errorf("pgcluster: pool mode must be %q, %q or %q, got %q", SessionPooling, TransactionPooling, StatementPooling, mode)
	}
	bin, err := findPgBouncer()
	if err != nil {
		return nil, err
	}
	srv, err := pgconn.ParseConfig(serverURL)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: pgbouncer: parse server URL: %w", err)
	}
	cfg := bouncerConfig{settings: map[string]string{
		"default_pool_size":  "4",
		"max_client_conn":    "500",
		"server_round_robin": "0",
	}}
	for _, o := range opts {
		o(&cfg)
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgfence-pgbouncer-*")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: pgbouncer directory: %w", err)
	}
	b := &PgBouncer{dir: dir, user: srv.User, mode: mode}
	// PgBouncer logs in to the server with the password from the user
	// list; clients are trusted.
	users := fmt.Sprintf("%s %s\n", quoteIni(srv.User), quoteIni(srv.Password))
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(users), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: pgbouncer user list: %w", err)
	}
	if cred != nil {
		for _, p := range []string{dir, filepath.Join(dir, "userlist.txt")} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				_ = os.RemoveAll(dir)
				return nil, fmt.Errorf("pgcluster: hand %s to uid %d: %w", p, cred.Uid, err)
			}
		}
	}
	for attempt := 0; ; attempt++ { // a free port can be taken before pgbouncer binds it
		if b.port, err = freePort(); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		if err = b.start(bin, cred, srv, cfg.settings); err == nil {
			return b, nil
		}
		if attempt == 2 {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
}

// quoteIni quotes s for pgbouncer's user list ("" doubles a quote).
func quoteIni(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func (b *PgBouncer) start(bin string, cred *syscall.Credential, srv *pgconn.Config, settings map[string]string) error {
	// The [databases] entry "*" forwards every database name to the same
	// server; host may be a Unix socket directory.
	var ini strings.Builder
	fmt.Fprintf(&ini, "[databases]\n* = host=%s port=%d\n\n[pgbouncer]\n", srv.Host, srv.Port)
	fixed := map[string]string{
		"listen_addr":     "127.0.0.1",
		"listen_port":     strconv.Itoa(b.port),
		"unix_socket_dir": "",
		"auth_type":       "trust",
		"auth_file":       filepath.Join(b.dir, "userlist.txt"),
		"pool_mode":       string(b.mode),
		"logfile":         filepath.Join(b.dir, "pgbouncer.log"),
		// pgx and psql send these at start-up; PgBouncer 1.18 refuses
		// start-up parameters it does not know.
		"ignore_startup_parameters": "extra_float_digits,search_path,statement_timeout,options",
	}
	for k, v := range settings {
		if _, ok := fixed[k]; !ok || k == "ignore_startup_parameters" {
			fixed[k] = v
		}
	}
	keys := make([]string, 0, len(fixed))
	for k := range fixed {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&ini, "%s = %s\n", k, fixed[k])
	}
	conf := filepath.Join(b.dir, "pgbouncer.ini")
	if err := os.WriteFile(conf, []byte(ini.String()), 0o644); err != nil {
		return fmt.Errorf("pgcluster: write pgbouncer.ini: %w", err)
	}
	if cred != nil {
		// The log file is created by pgbouncer itself, in dir, which it owns.
		if err := os.Chown(conf, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("pgcluster: hand pgbouncer.ini to uid %d: %w", cred.Uid, err)
		}
	}
	out, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: pgbouncer output file: %w", err)
	}
	cmd := exec.Command(bin, conf)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		Setpgid:    true,
		// If this process dies, pgbouncer (1.18: SIGTERM is immediate
		// shutdown) does not outlive it.
		Pdeathsig: syscall.SIGTERM,
	}
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("pgcluster: start pgbouncer: %w", err)
	}
	exit := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(exit)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", b.addr(), time.Second)
		if err == nil {
			_ = c.Close()
			b.mu.Lock()
			b.cmd, b.exit = cmd, exit
			b.mu.Unlock()
			return nil
		}
		select {
		case <-exit:
			return fmt.Errorf("pgcluster: pgbouncer exited during start-up:\n%s", b.logTail())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exit
			return fmt.Errorf("pgcluster: pgbouncer did not listen on %s within 30s: %w\n%s", b.addr(), err, b.logTail())
		}
		time.Sleep(20 * time.Millisecond) // poll until it listens: no event announces it
	}
}

func (b *PgBouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Port is the loopback TCP port PgBouncer listens on.
func (b *PgBouncer) Port() int { return b.port }

// Mode is the pool mode PgBouncer was started with.
func (b *PgBouncer) Mode() PoolMode { return b.mode }

// URL is a connection URL for database dbname of the server, through
// PgBouncer, as the server URL's user (no password needed: PgBouncer
// trusts its clients). pgx clients behind TransactionPooling need a query
// exec mode that uses no named prepared statements: append
// "&default_query_exec_mode=exec" (or cache_describe, or simple_protocol).
func (b *PgBouncer) URL(dbname string) string {
	u := url.URL{Scheme: "postgres", User: url.User(b.user), Host: b.addr(), Path: "/" + dbname, RawQuery: "sslmode=disable"}
	return u.String()
}

// Close stops PgBouncer at once (SIGTERM: immediate shutdown, client and
// server connections closed), waits for it to exit, and removes its
// directory. It is safe to call more than once.
func (b *PgBouncer) Close() error {
	b.mu.Lock()
	cmd, exit := b.cmd, b.exit
	b.cmd, b.exit = nil, nil
	b.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exit:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exit
		}
	}
	return os.RemoveAll(b.dir)
}

func (b *PgBouncer) logTail() string {
	var s string
	for _, f := range []string{"stderr.log", "pgbouncer.log"} {
		bs, _ := os.ReadFile(filepath.Join(b.dir, f))
		if len(bs) > 3000 {
			bs = bs[len(bs)-3000:]
		}
		s += string(bs)
	}
	return s
}
