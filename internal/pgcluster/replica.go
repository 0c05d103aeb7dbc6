package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// StandbyOption configures NewStandby.
type StandbyOption func(*standbyConfig)

type standbyConfig struct {
	name     string
	upstream string
	settings map[string]string
}

// WithStandbyName sets the application_name the standby's walreceiver
// reports to the primary: the name to list in the primary's
// synchronous_standby_names. Default "standby"; it must be a plain
// identifier (letters, digits, underscore).
func WithStandbyName(name string) StandbyOption {
	return func(c *standbyConfig) { c.name = name }
}

// WithUpstream makes the standby's walreceiver connect to addr (host:port)
// instead of the primary's own port: a proxy in front of the primary, so
// that a test can partition replication. The base backup is still taken
// from the primary directly. Default: the primary's address.
func WithUpstream(addr string) StandbyOption {
	return func(c *standbyConfig) { c.upstream = addr }
}

// WithStandbySetting sets a server parameter of the standby (postgres -c
// name=value). The primary's settings are not inherited: a setting such as
// synchronous_standby_names would make the standby, once promoted, wait for
// a standby of its own.
func WithStandbySetting(name, value string) StandbyOption {
	return func(c *standbyConfig) { c.settings[name] = value }
}

// NewStandby makes a streaming hot standby of the running cluster c: a base
// backup (pg_basebackup -R, from c's own binaries) into a new data
// directory, started on its own loopback port with primary_conninfo
// pointing at c (or at WithUpstream's address) under WithStandbyName's
// application_name. Replication is asynchronous unless the primary lists
// that name in synchronous_standby_names. NewStandby returns once the
// standby accepts read-only connections; it does not wait for it to catch
// up. The caller owns the standby and must Close it; Promote makes it a
// primary.
//
// The primary needs wal_level replica or logical (the default) and a free
// WAL sender (max_wal_senders, default 10); initdb's pg_hba.conf already
// trusts replication connections from 127.0.0.1.
func (c *Cluster) NewStandby(opts ...StandbyOption) (*Cluster, error) {
	cfg := standbyConfig{name: "standby", settings: map[string]string{}}
	for _, o := range opts {
		o(&cfg)
	}
	if !plainIdentifier(cfg.name) {
		return nil, fmt.Errorf("pgcluster: standby name must be 1 to 63 letters, digits or underscores, got %q", cfg.name)
	}
	if cfg.upstream == "" {
		cfg.upstream = net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
	}
	upHost, upPort, err := net.SplitHostPort(cfg.upstream)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: standby upstream %q: %w", cfg.upstream, err)
	}
	if c.Pid() == 0 {
		return nil, errors.New("pgcluster: NewStandby: the primary is not running")
	}

	dir, err := os.MkdirTemp("", "pgfence-standby-*")
	if err != nil {
		return nil, fmt.Errorf("make standby directory: %w", err)
	}
	s := &Cluster{bin: c.bin, dir: dir, settings: cfg.settings, cred: c.cred}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("hand standby directory to uid %d: %w", s.cred.Uid, err)
		}
	}
	// -R writes standby.signal and a primary_conninfo naming the primary;
	// the one below (a -c setting) overrides it with the upstream and the
	// application_name. -c fast starts with an immediate checkpoint
	// instead of waiting for a spread one.
	basebackup, err := c.tool("pg_basebackup")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	backup := exec.Command(basebackup,
		"-D", s.DataDir(), "-R", "-X", "stream", "-c", "fast", "--no-sync",
		"-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-U", "postgres")
	backup.Dir = dir // a directory the server user may enter
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := backup.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_basebackup from port %d: %w\n%s", c.port, err, out)
	}
	s.settings["primary_conninfo"] = fmt.Sprintf("host=%s port=%s user=postgres application_name=%s connect_timeout=5",
		upHost, upPort, cfg.name)
	if err := s.Start(); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("start standby: %w", err)
	}
	return s, nil
}

// Promote ends recovery on a standby (SELECT pg_promote(wait => true)): it
// stops streaming, switches to a new timeline and starts accepting writes.
// It returns once the server is a primary, or an error if that takes longer
// than ctx allows (at most 60s). Promoting a server that is not a standby
// fails.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgconn.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgcluster: promote: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	wait := 60
	if d, ok := ctx.Deadline(); ok {
		wait = max(1, min(wait, int(time.Until(d)/time.Second)))
	}
	res := conn.ExecParams(ctx, "SELECT pg_promote(true, $1)", [][]byte{[]byte(strconv.Itoa(wait))}, nil, nil, nil).Read()
	if res.Err != nil {
		return fmt.Errorf("pgcluster: promote: %w", res.Err)
	}
	if len(res.Rows) != 1 || string(res.Rows[0][0]) != "t" {
		return fmt.Errorf("pgcluster: promote: the standby did not finish promotion within %ds", wait)
	}
	return nil
}

// tool finds one of the server's client programs (pg_basebackup) from the
// same installation as the server: in BinDir, else beside the file the
// postgres binary links to (BinDir may be a directory of symlinks, such as
// /usr/local/bin, that holds only initdb and postgres).
func (c *Cluster) tool(name string) (string, error) {
	p := filepath.Join(c.bin, name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if real, err := filepath.EvalSymlinks(filepath.Join(c.bin, "postgres")); err == nil {
		p = filepath.Join(filepath.Dir(real), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("pgcluster: %s not found in %s nor beside the postgres binary it runs", name, c.bin)
}

func plainIdentifier(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// Tool finds one of the server's client programs (pg_dump, pg_restore,
// pg_basebackup) from the same installation as the server.
func (c *Cluster) Tool(name string) (string, error) { return c.tool(name) }
