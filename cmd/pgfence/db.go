package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/redact"
)

// connectTimeout bounds the first connection when the connection string
// sets no connect_timeout.
const connectTimeout = 10 * time.Second

// answerTimeout bounds how long a one-shot command (check, leases, locks,
// fence bump) waits for the database beyond the waits it was asked for
// (--timeout): a server that stops answering once connected — frozen, cut
// off, or a query queued behind a lock — must not leave the command, run
// from cron, hanging. It then exits 69.
const answerTimeout = 30 * time.Second

// errNoAnswer is the cause of a one-shot command's context once
// answerTimeout has passed.
var errNoAnswer = errors.New("no answer from the database in time")

// bounded runs fn, a one-shot command's work, with ctx bounded by
// answerTimeout plus wait, and reports the bound passing as the database
// being unavailable (exit 69).
func bounded(ctx context.Context, wait time.Duration, fn func(context.Context) error) error {
	limit := answerTimeout + wait
	bctx, cancel := context.WithTimeoutCause(ctx, limit, errNoAnswer)
	defer cancel()
	err := fn(bctx)
	if err != nil && errors.Is(context.Cause(bctx), errNoAnswer) {
		return &exitError{code: exitUnavailable, err: fmt.Errorf(
			"the database did not answer within %s (a server frozen or cut off once connected, or a statement waiting for a lock): %w", limit, err)}
	}
	return err
}

// libpqEnv are the libpq environment variables pgx reads; any of them set
// counts as "a database is configured" for demo.
var libpqEnv = []string{
	"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD",
	"PGPASSFILE", "PGSERVICE", "PGSERVICEFILE", "PGSSLMODE", "PGCONNECT_TIMEOUT",
	"PGAPPNAME", "PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT", "PGTARGETSESSIONATTRS",
}

// connString returns the connection string to use: --database-url, else
// DATABASE_URL, else "" (pgx then reads the PG* variables).
func (g *globals) connString() string {
	if g.databaseURL != "" {
		return g.databaseURL
	}
	return os.Getenv("DATABASE_URL")
}

// connSecrets returns what the password of the connection string could
// be (--database-url, DATABASE_URL, PGPASSWORD), for redacting the errors
// the command prints: see internal/redact.
func connSecrets(root *cobra.Command) []string {
	var out []string
	if f := root.PersistentFlags().Lookup("database-url"); f != nil {
		out = append(out, redact.Secrets(f.Value.String())...)
	}
	return append(out, redact.Secrets(os.Getenv("DATABASE_URL"))...)
}

// redactWriter writes to w with the connection string's password redacted
// (secrets, read at each write: the flags are parsed by then). The
// command's messages on stderr go through it, those printed while it runs
// as well as its final error; a command that `pgfence run` starts writes
// to the process's stderr itself.
type redactWriter struct {
	w       io.Writer
	secrets func() []string
}

func (r *redactWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(r.w, redact.String(string(p), r.secrets())); err != nil {
		return 0, err
	}
	return len(p), nil
}

// configured reports whether the operator pointed pgfence at a database at
// all, by flag, DATABASE_URL or any PG* variable.
func (g *globals) configured() bool {
	if g.connString() != "" {
		return true
	}
	for _, k := range libpqEnv {
		if os.Getenv(k) != "" {
			return true
		}
	}
	return false
}

// openPool parses the connection string, opens a pool of at most maxConns
// connections named application_name=appName (unless the string names one)
// and checks that the database answers. The errors say what to fix.
func openPool(ctx context.Context, connString, appName string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, usageError(fmt.Errorf("invalid connection string%s (check --database-url, DATABASE_URL or the PG* variables)",
			parseReason(err, connString)))
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok && appName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, connectError(cfg.ConnConfig.Config, err)
	}
	return pool, nil
}

// checkConnect connects once and closes, for commands that connect by
// other means (migrate): it turns "cannot connect" into a clear message
// before the work starts.
func checkConnect(ctx context.Context, connString string) error {
	pool, err := openPool(ctx, connString, "pgfence migrate", 1)
	if err != nil {
		return err
	}
	pool.Close()
	return nil
}

// connectError explains a failed first connection: whether the server did
// not answer (exit 69) or answered with a refusal (bad password, unknown
// database: exit 1), naming host, port, database and user but never the
// password.
func connectError(cfg pgconn.Config, err error) error {
	target := fmt.Sprintf("%s (database %q, user %q)", hostPort(cfg), cfg.Database, cfg.User)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Errorf("PostgreSQL at %s refused the connection: %s (SQLSTATE %s)", target, pgErr.Message, pgErr.Code)
	}
	var netErr net.Error
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr):
		// pgx repeats the dial error once per address tried; the first
		// says it.
		err = opErr
	case errors.As(err, &netErr), errors.Is(err, context.DeadlineExceeded):
	default:
		return fmt.Errorf("connect to PostgreSQL at %s: %w", target, err)
	}
	return &exitError{code: exitUnavailable, err: fmt.Errorf(
		"PostgreSQL at %s is unreachable: %w (is the server running? check --database-url, DATABASE_URL or PGHOST/PGPORT)", target, err)}
}

func hostPort(cfg pgconn.Config) string {
	if strings.HasPrefix(cfg.Host, "/") {
		return fmt.Sprintf("unix socket %s/.s.PGSQL.%d", cfg.Host, cfg.Port)
	}
	return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
}

// SQLSTATEs the command's own SQL reads (fence.go); the hints for them
// live in internal/pgerr, shared with the libraries.
const (
	sqlstateUndefinedTable    = pgerr.UndefinedTable
	sqlstateUndefinedFunction = pgerr.UndefinedFunction
	sqlstateInsufficientPriv  = pgerr.InsufficientPrivilege
)

// errNotMigrated is the error for a database without the pgfence schema.
var errNotMigrated = errors.New(pgerr.HintNotMigrated)

// checkSchema fails with errNotMigrated when the database has no
// pgfence.leases table.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var present bool
	if err := pool.QueryRow(ctx, sqlSchemaPresent).Scan(&present); err != nil {
		return schemaHint(fmt.Errorf("check for the pgfence schema: %w", err))
	}
	if !present {
		return errNotMigrated
	}
	return nil
}

// openSchemaPool is openPool for a command that needs pgfence's schema: it
// fails, with the pool closed, when the schema is missing (checkSchema).
func openSchemaPool(ctx context.Context, connString, appName string, maxConns int32) (*pgxpool.Pool, error) {
	pool, err := openPool(ctx, connString, appName, maxConns)
	if err != nil {
		return nil, err
	}
	if err := checkSchema(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// schemaHint puts the hint for err's SQLSTATE (run `pgfence migrate up`,
// the grants, the primary) in front of err; the libraries add the same
// hints, from the same place (internal/pgerr).
func schemaHint(err error) error { return pgerr.WithHint(err) }

// parseReason is why pgx could not parse connString, as ": reason", or ""
// when it does not say: its message without the string it quotes (which
// may hold a password: pgx redacts it only on a best-effort basis), and
// with every piece of connString's secrets redacted, since the reason may
// quote a misparsed part of the string (a URL's parse error does). Without
// it, a missing TLS key file or a port that is not a number read only
// "invalid connection string".
func parseReason(err error, connString string) string {
	var pce *pgconn.ParseConfigError
	if !errors.As(err, &pce) {
		return ""
	}
	bare := *pce
	bare.ConnString = ""
	reason, ok := strings.CutPrefix(bare.Error(), "cannot parse ``: ")
	if !ok || reason == "" {
		return ""
	}
	return ": " + redact.String(reason, redact.Secrets(connString))
}
