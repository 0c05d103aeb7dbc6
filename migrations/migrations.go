package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/redact"
)

// FS holds the SQL migration files, named the way golang-migrate expects
// (NNNNNN_title.up.sql / NNNNNN_title.down.sql) at the root of the FS.
//
//go:embed *.sql
var FS embed.FS

// Table is the bookkeeping table for pgfence's migrations, in golang-migrate's
// format (version bigint, dirty boolean), in the connection's current
// schema. It is distinct from golang-migrate's default (schema_migrations),
// so pgfence's history never collides with the application's own. Pass it
// to the upstream CLI as x-migrations-table=pgfence_schema_migrations: the
// two interoperate, and serialise on the same advisory lock.
const Table = "pgfence_schema_migrations"

// applicationName names the migrations' connection (application_name)
// unless the database URL or PGAPPNAME names it.
const applicationName = "pgfence migrations"

// ErrDirty is returned by Up and Down when a migration was left dirty: it
// failed in a way whose outcome is unknown (the connection lost as it ran),
// or the upstream CLI's failed. Check the schema by hand, then record the
// right version with Force (pgfence migrate force N). A file that the server
// refused leaves the version as it was, clean (see Up).
var ErrDirty = errors.New("migrations: database is dirty: a migration did not finish")

// ErrDownRefused is returned by Down when reverting the migrations would
// fail part-way: an object outside schema pgfence depends on it (a view
// over pgfence.leases, say), a protected table's guard triggers belong to
// a role that the role running Down cannot act as, or schema pgfence
// belongs to another role. Down checks before it reverts anything, so the
// database is left as it was, at its version and clean; the error names
// the objects.
var ErrDownRefused = errors.New("migrations: down refused: it would fail part-way")

// ErrInvalid is returned for a connection string that cannot be parsed
// (its message never repeats the string, which may hold a password), and
// by Force for a version that is not a migration's.
var ErrInvalid = errors.New("migrations: invalid input")

// Up applies every pending migration, each file in its own transaction. It
// is safe to run from many processes at once (and beside the upstream CLI):
// they serialise on golang-migrate's advisory lock, and the ones that find
// the schema current return nil. Finding it current needs only SELECT on
// the bookkeeping table Table (the table is created only when missing);
// applying a migration needs the migration role (see the package doc,
// "Privileges").
//
// databaseURL is a PostgreSQL connection string in URL or keyword/value form
// (anything pgx.ParseConfig accepts); errors never quote it. The
// connection's application_name is "pgfence migrations" unless it names
// one. ctx bounds connecting and waiting for the lock, whatever
// statement_timeout or transaction_timeout the role sets; once a migration
// has started it runs to its end, and cancelling ctx stops before the next
// one. A migration that fails with the server's error (a lock_timeout the
// role sets, a deadlock) commits nothing, since each file is one
// transaction: Up returns that error and leaves the version at the last
// migration applied, clean, so that running Up again resumes there.
func Up(ctx context.Context, databaseURL string, opts ...Option) error {
	if err := run(ctx, databaseURL, up, opts); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Down reverts every applied migration, removing the pgfence schema and the
// guard triggers pgfence.protect installed. It drops nothing of the
// application's: an application object that depends on pgfence makes it
// fail with ErrDownRefused before it changes anything, and so does a
// protected table that the role running Down cannot act as the owner of
// (it could not remove the table's guard). The bookkeeping table Table is
// left in place, empty, as golang-migrate leaves it. Like Up, it
// serialises with other runs.
//
// Down drops the roles pgfence_client and pgfence_operator too (they are
// cluster-wide), unless another database of the cluster still grants them
// something, and with them every membership in them: each GRANT
// pgfence_client TO app is gone, and a later Up creates the roles without
// members.
func Down(ctx context.Context, databaseURL string, opts ...Option) error {
	if err := run(ctx, databaseURL, down, opts); err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}

// Version reports the applied migration version and whether the last
// migration failed half-way (dirty). It returns version 0 when none is
// applied.
func Version(ctx context.Context, databaseURL string) (version uint, dirty bool, err error) {
	err = withConn(ctx, databaseURL, nil, func(conn *pgx.Conn, b bookkeeping) error {
		var verr error
		version, dirty, verr = b.version(ctx, conn)
		return verr
	})
	if err != nil {
		return 0, false, fmt.Errorf("migrations: version: %w", err)
	}
	return version, dirty, nil
}

// Latest is the version Up migrates to: the highest version in FS.
func Latest() (uint, error) {
	ms, err := load()
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	return ms[len(ms)-1].version, nil
}

// migration is one version's pair of files.
type migration struct {
	version  uint
	up, down string // file names
}

// load reads the versions in FS, in ascending order.
func load() ([]migration, error) {
	entries, err := fs.ReadDir(FS, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded files: %w", err)
	}
	byVersion := map[uint]*migration{}
	for _, e := range entries {
		name := e.Name()
		digits, rest, ok := strings.Cut(name, "_")
		v, err := strconv.ParseUint(digits, 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("embedded file %q: want NNNNNN_title.up.sql or .down.sql", name)
		}
		m := byVersion[uint(v)]
		if m == nil {
			m = &migration{version: uint(v)}
			byVersion[uint(v)] = m
		}
		switch {
		case strings.HasSuffix(rest, ".up.sql"):
			m.up = name
		case strings.HasSuffix(rest, ".down.sql"):
			m.down = name
		default:
			return nil, fmt.Errorf("embedded file %q: want NNNNNN_title.up.sql or .down.sql", name)
		}
	}
	ms := make([]migration, 0, len(byVersion))
	for _, m := range byVersion {
		if m.up == "" || m.down == "" {
			return nil, fmt.Errorf("migration %d lacks its up or down file", m.version)
		}
		ms = append(ms, *m)
	}
	if len(ms) == 0 {
		return nil, errors.New("no embedded migrations")
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

type direction bool

const (
	up   direction = true
	down direction = false
)

// Option configures Up and Down.
type Option func(*options) error

type options struct {
	notice func(message, hint string)
}

// noticePrefix begins the message of every notice the migration files
// raise.
const noticePrefix = "pgfence: "

// WithNotices has f called with the message and hint ("" for none) of each
// notice the migration files raise while Up or Down runs: that this role
// could not create the roles, or grant one, and what to run instead; that
// Down kept the roles because another database uses them. Their messages
// begin "pgfence: ". PostgreSQL's own notices (a DROP ... IF EXISTS that
// found nothing) are not passed on. f is called from the goroutine that
// called Up or Down, before it returns. Without this option the notices
// are dropped.
func WithNotices(f func(message, hint string)) Option {
	return func(o *options) error {
		if f == nil {
			return fmt.Errorf("%w: WithNotices: function must not be nil", ErrInvalid)
		}
		o.notice = f
		return nil
	}
}

// run migrates all the way up or down under the advisory lock.
func run(ctx context.Context, databaseURL string, dir direction, opts []Option) error {
	var o options
	for _, opt := range opts {
		if opt == nil {
			return fmt.Errorf("%w: option must not be nil", ErrInvalid)
		}
		if err := opt(&o); err != nil {
			return err
		}
	}
	ms, err := load()
	if err != nil {
		return err
	}
	var onNotice pgconn.NoticeHandler
	if o.notice != nil {
		onNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if strings.HasPrefix(n.Message, noticePrefix) {
				o.notice(n.Message, n.Hint)
			}
		}
	}
	return withLock(ctx, databaseURL, onNotice, func(conn *pgx.Conn, b bookkeeping) error {
		cur, dirty, err := b.read(ctx, conn) // withLock made sure it exists
		if err != nil {
			return err
		}
		if dirty {
			return fmt.Errorf("%w (version %d)", ErrDirty, cur)
		}
		steps, err := plan(ms, cur, dir)
		if err != nil {
			return err
		}
		if dir == down && len(steps) > 0 {
			if err := checkDown(ctx, conn); err != nil {
				return err
			}
		}
		for _, s := range steps {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("stopped before migration %d: %w", s.file.version, context.Cause(ctx))
			}
			if err := apply(ctx, conn, b, cur, s); err != nil {
				return err
			}
			cur = s.target
		}
		return nil
	})
}

// withLock is withConn on a pinned session (pin) holding the migration
// lock, with the bookkeeping table created if it was missing: where Up,
// Down and Force do their work.
func withLock(ctx context.Context, databaseURL string, onNotice pgconn.NoticeHandler, fn func(*pgx.Conn, bookkeeping) error) error {
	return withConn(ctx, databaseURL, onNotice, func(conn *pgx.Conn, b bookkeeping) error {
		if err := pin(ctx, conn); err != nil {
			return err
		}
		if err := b.lock(ctx, conn); err != nil {
			return err
		}
		defer b.unlock(conn)
		// Created only when missing, as golang-migrate does: CREATE TABLE
		// IF NOT EXISTS needs CREATE on the schema even when the table is
		// there, which a replica's least-privileged role lacks. Under the
		// lock: concurrent creations can fail.
		if err := b.create(ctx, conn); err != nil {
			return err
		}
		return fn(conn, b)
	})
}

// pin sets the session's search path to pg_catalog alone and its
// statement_timeout and (PostgreSQL 17 on) transaction_timeout to 0.
//
// The files name pgfence's objects schema-qualified and PostgreSQL's
// unqualified. With the role's own search path, a look-alike that another
// role created in one of its schemas (public, before PostgreSQL 15) is
// chosen where it matches an argument type better than the built-in (oid
// <> integer): run as this role by a DO block, or bound into a SQL
// function's body. pg_catalog alone leaves no choice; the bookkeeping
// table was found with the role's path, and is named schema-qualified.
//
// A role's or database's default timeout (ALTER ROLE ... SET
// statement_timeout) would end the wait for the migration lock, which ctx
// bounds, and a file part-way, which must run to its end (migration 9
// waits up to 10 minutes for fenced transactions): the migration would
// fail, and transaction_timeout, which ends the session, would leave the
// version dirty.
func pin(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false),
       pg_catalog.set_config('statement_timeout', '0', false),
       (SELECT pg_catalog.set_config(name, '0', false) FROM pg_catalog.pg_settings WHERE name = 'transaction_timeout')`); err != nil {
		return fmt.Errorf("pin the search path and the timeouts: %w", err)
	}
	return nil
}

// checkDown refuses a Down that would stop part-way, before it changes
// anything: golang-migrate's files run one transaction each, so a Down
// refused by migration 1 (an application view over pgfence.leases) would
// have reverted every other migration first and stopped at version 1.
func checkDown(ctx context.Context, conn *pgx.Conn) error {
	rows, err := conn.Query(ctx, sqlDownBlockers)
	if err != nil {
		return fmt.Errorf("look for what depends on schema pgfence: %w", err)
	}
	blockers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("look for what depends on schema pgfence: %w", err)
	}
	if len(blockers) == 0 {
		return nil
	}
	return fmt.Errorf("%w; nothing was changed: %s", ErrDownRefused, strings.Join(blockers, "; "))
}

// sqlDownBlockers lists what would make the down files fail: schema
// pgfence owned by a role the current one cannot act as; objects outside
// schema pgfence that depend on one inside it (a normal dependency: the
// down files drop nothing with CASCADE), except the guard triggers of
// tables the current role owns, which the down files remove; and those of
// tables it does not own, which it cannot remove. A rule, trigger or
// column default is judged by the schema of its table.
const sqlDownBlockers = `
WITH ours AS (
    SELECT 'pg_catalog.pg_class'::regclass AS classid, c.oid
      FROM pg_catalog.pg_class AS c WHERE c.relnamespace = pg_catalog.to_regnamespace('pgfence')
    UNION ALL
    SELECT 'pg_catalog.pg_proc'::regclass, p.oid
      FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = pg_catalog.to_regnamespace('pgfence')
    UNION ALL
    SELECT 'pg_catalog.pg_type'::regclass, t.oid
      FROM pg_catalog.pg_type AS t WHERE t.typnamespace = pg_catalog.to_regnamespace('pgfence')
), deps AS (
    SELECT DISTINCT d.classid, d.objid, d.objsubid,
           CASE d.classid
               WHEN 'pg_catalog.pg_rewrite'::regclass THEN (SELECT r.ev_class FROM pg_catalog.pg_rewrite AS r WHERE r.oid = d.objid)
               WHEN 'pg_catalog.pg_trigger'::regclass THEN (SELECT g.tgrelid FROM pg_catalog.pg_trigger AS g WHERE g.oid = d.objid)
               WHEN 'pg_catalog.pg_attrdef'::regclass THEN (SELECT a.adrelid FROM pg_catalog.pg_attrdef AS a WHERE a.oid = d.objid)
           END AS rel
      FROM pg_catalog.pg_depend AS d
      JOIN ours AS o ON o.classid = d.refclassid AND o.oid = d.refobjid
     WHERE d.deptype = 'n'
)
SELECT pg_catalog.format('schema pgfence belongs to role %s: run Down as it (or a member of it)', n.nspowner::regrole)
  FROM pg_catalog.pg_namespace AS n
 WHERE n.nspname = 'pgfence' AND NOT pg_catalog.pg_has_role(n.nspowner, 'USAGE')
UNION
SELECT CASE WHEN x.classid = 'pg_catalog.pg_trigger'::regclass
            THEN pg_catalog.format('protected table %s belongs to role %s: have it drop the triggers pgfence_guard and pgfence_guard_truncate, or run Down as it',
                                   x.rel::regclass, c.relowner::regrole)
            WHEN x.classid = 'pg_catalog.pg_rewrite'::regclass -- a view's rule: name the view
            THEN pg_catalog.pg_describe_object('pg_catalog.pg_class'::regclass, x.rel, 0) || ' depends on schema pgfence: drop it first'
            ELSE pg_catalog.pg_describe_object(x.classid, x.objid, x.objsubid) || ' depends on schema pgfence: drop it first'
       END
  FROM deps AS x
  LEFT JOIN pg_catalog.pg_class AS c ON c.oid = x.rel
 WHERE CASE WHEN x.rel IS NOT NULL THEN c.relnamespace <> pg_catalog.to_regnamespace('pgfence')
            ELSE (pg_catalog.pg_identify_object(x.classid, x.objid, x.objsubid)).schema IS DISTINCT FROM 'pgfence' END
   AND NOT (x.classid = 'pg_catalog.pg_trigger'::regclass AND pg_catalog.pg_has_role(c.relowner, 'USAGE'))
ORDER BY 1`

// step runs one file and leaves the database at version target (0: none).
type step struct {
	file   migration
	name   string // the file to run
	target uint
}

// plan lists the files to run from version cur.
func plan(ms []migration, cur uint, dir direction) ([]step, error) {
	at := -1 // index of the applied version; -1: none
	for i, m := range ms {
		if m.version == cur {
			at = i
		}
	}
	if cur != 0 && at < 0 {
		return nil, fmt.Errorf("the database is at version %d, which this build does not know: use a newer pgfence", cur)
	}
	var steps []step
	if dir == up {
		for _, m := range ms[at+1:] {
			steps = append(steps, step{file: m, name: m.up, target: m.version})
		}
		return steps, nil
	}
	for i := at; i >= 0; i-- {
		var target uint
		if i > 0 {
			target = ms[i-1].version
		}
		steps = append(steps, step{file: ms[i], name: ms[i].down, target: target})
	}
	return steps, nil
}

// apply runs one file, from version from, the way golang-migrate does:
// mark the target version dirty, run the file, mark it clean. The file
// runs to its end even if ctx ends meanwhile (a half-run migration is what
// dirty means); its own BEGIN/COMMIT make it atomic. So when the server
// refuses it — a lock_timeout, a deadlock, an object in the way — and the
// session rolls it back, nothing of it committed: the version goes back to
// from, clean, and the error says so, where golang-migrate leaves it dirty
// for an operator to force. A file whose outcome is unknown (the
// connection lost) leaves it dirty.
func apply(ctx context.Context, conn *pgx.Conn, b bookkeeping, from uint, s step) error {
	sql, err := fs.ReadFile(FS, s.name)
	if err != nil {
		return fmt.Errorf("read %s: %w", s.name, err)
	}
	if err := b.set(ctx, conn, s.target, true); err != nil {
		return err
	}
	rctx := context.WithoutCancel(ctx)
	if _, err := conn.Exec(rctx, string(sql)); err != nil {
		_, _ = conn.Exec(rctx, "ROLLBACK") // leave the file's failed transaction, if any
		if rolledBack(conn, err) && b.set(rctx, conn, from, false) == nil {
			return fmt.Errorf("run %s: %w (it changed nothing: the version is still %d)", s.name, err, from)
		}
		return fmt.Errorf("run %s: %w", s.name, err)
	}
	return b.set(rctx, conn, s.target, false)
}

// rolledBack reports whether a file that failed with err committed
// nothing: the server raised an ERROR (not FATAL: the session lives on;
// the unlocalized severity, whatever lc_messages says), and the session is
// idle again, outside any transaction. Every file is one transaction
// (TestFilesAreOneTransaction), and the server skips the rest of a
// multi-statement query after an error.
func rolledBack(conn *pgx.Conn, err error) bool {
	pg := conn.PgConn()
	return pgerr.StatementError(err) && !pg.IsClosed() && pg.TxStatus() == 'I'
}

// bookkeeping is the version table and the advisory lock, named as
// golang-migrate's pgx/v5 driver names them.
type bookkeeping struct {
	table  string // schema-qualified, quoted
	lockID int64
}

// withConn connects, resolves the bookkeeping names and runs fn; onNotice
// (nil for none) handles the server's notices; the connection is closed
// before it returns. Its errors never show the
// password, in whole or in part: pgx's parse error is not passed on (it may
// echo a piece of a malformed string), and every other error's text is
// redacted of what the password could be.
func withConn(ctx context.Context, databaseURL string, onNotice pgconn.NoticeHandler, fn func(*pgx.Conn, bookkeeping) error) error {
	return redact.ErrorFor(connect(ctx, databaseURL, onNotice, fn), databaseURL)
}

func connect(ctx context.Context, databaseURL string, onNotice pgconn.NoticeHandler, fn func(*pgx.Conn, bookkeeping) error) error {
	if ctx == nil {
		return fmt.Errorf("%w: context must not be nil", ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		// pgx's message quotes the string (with the password only partly
		// redacted when it is escaped): say nothing of it.
		return fmt.Errorf("%w: the database URL cannot be parsed (its text is not repeated here: it may hold a password)", ErrInvalid)
	}
	if _, ok := cfg.RuntimeParams["application_name"]; !ok {
		// Named in pg_stat_activity, for an operator looking for what a
		// migration waits on, or what waits on it.
		cfg.RuntimeParams["application_name"] = applicationName
	}
	if onNotice != nil {
		cfg.OnNotice = onNotice
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	var db, schema string
	if err := conn.QueryRow(ctx, sqlBookkeepingSchema, Table).Scan(&db, &schema); err != nil {
		return fmt.Errorf("find the schema of %s: %w", Table, err)
	}
	b := bookkeeping{
		table:  pgx.Identifier{schema, Table}.Sanitize(),
		lockID: advisoryLockID(db, schema, Table),
	}
	return fn(conn, b)
}

// sqlBookkeepingSchema finds where the bookkeeping table lives: the first
// schema on the search path that has it, else the first one that is not
// pgfence (which Down drops, and which a role named pgfence finds first on
// its search path once Up has created it), else the current schema.
const sqlBookkeepingSchema = `
SELECT current_database(), coalesce(
    (SELECT n.nspname FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
      WHERE c.relname = $1 AND c.relkind IN ('r', 'p') AND n.nspname = ANY (current_schemas(false))
      ORDER BY array_position(current_schemas(false), n.nspname) LIMIT 1),
    (SELECT s FROM unnest(current_schemas(false)) WITH ORDINALITY AS u(s, i) WHERE s <> 'pgfence' ORDER BY i LIMIT 1),
    current_schema())`

// advisoryLockID is golang-migrate's database.GenerateAdvisoryLockId for
// (database, schema, table): the CRC-32 of the names joined by NUL, times a
// salt, in uint32 arithmetic. Equal IDs make this package and the upstream
// CLI wait for each other.
func advisoryLockID(db, schema, table string) int64 {
	const salt = 1486364155
	sum := crc32.ChecksumIEEE([]byte(schema + "\x00" + table + "\x00" + db))
	return int64(sum * uint32(salt))
}

func (b bookkeeping) lock(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, b.lockID); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	return nil
}

// unlock releases the lock; closing the connection would too.
func (b bookkeeping) unlock(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, b.lockID)
}

// create creates the bookkeeping table if it does not exist.
func (b bookkeeping) create(ctx context.Context, conn *pgx.Conn) error {
	exists, err := b.exists(ctx, conn)
	if err != nil || exists {
		return err
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+b.table+` (version bigint not null primary key, dirty boolean not null)`); err != nil {
		return fmt.Errorf("create %s: %w", b.table, err)
	}
	return nil
}

// exists reports whether the bookkeeping table exists.
func (b bookkeeping) exists(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.to_regclass($1) IS NOT NULL`, b.table).Scan(&exists); err != nil {
		return false, fmt.Errorf("look for %s: %w", b.table, err)
	}
	return exists, nil
}

// version reads the recorded version and whether it is dirty: 0, clean,
// when the bookkeeping table does not exist.
func (b bookkeeping) version(ctx context.Context, conn *pgx.Conn) (uint, bool, error) {
	exists, err := b.exists(ctx, conn)
	if err != nil || !exists {
		return 0, false, err
	}
	return b.read(ctx, conn)
}

// read is version for a bookkeeping table that exists.
func (b bookkeeping) read(ctx context.Context, conn *pgx.Conn) (uint, bool, error) {
	var v int64
	var dirty bool
	err := conn.QueryRow(ctx, `SELECT version, dirty FROM `+b.table+` LIMIT 1`).Scan(&v, &dirty)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, false, nil
	case pgerr.Code(err) == pgerr.InsufficientPrivilege:
		return 0, false, fmt.Errorf("read %s (on a current schema, Up and Version need SELECT on it and nothing else: GRANT SELECT ON %s TO pgfence_client, or run them as the migration role): %w", b.table, b.table, err)
	case err != nil:
		return 0, false, fmt.Errorf("read %s: %w", b.table, err)
	case v < 0:
		return 0, dirty, nil // golang-migrate's NilVersion, dirty after a failed first down
	}
	return uint(v), dirty, nil
}

// set records version v (0: none) as golang-migrate does: the table holds at
// most one row; version 0 clean leaves it empty.
func (b bookkeeping) set(ctx context.Context, conn *pgx.Conn, v uint, dirty bool) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("record version %d: %w", v, err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `TRUNCATE `+b.table); err != nil {
		return fmt.Errorf("record version %d: %w", v, err)
	}
	if v > 0 || dirty {
		version := int64(v)
		if v == 0 {
			version = -1 // golang-migrate's NilVersion
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+b.table+` (version, dirty) VALUES ($1, $2)`, version, dirty); err != nil {
			return fmt.Errorf("record version %d: %w", v, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("record version %d: %w", v, err)
	}
	return nil
}
