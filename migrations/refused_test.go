package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// atVersion3 returns a context for the test, the URL of a database of its
// own at version 3, and a connection to it.
func atVersion3(t *testing.T) (context.Context, string, *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	u := pgtest.EmptyURL(t)
	admin := connect(t, u)
	upTo(t, ctx, admin, 3)
	return ctx, u, admin
}

// TestRefusedFileLeavesVersionClean (scenario: the migration role sets
// lock_timeout, as is common for DDL on a busy database, and an
// application transaction reads pgfence.leases while migration 4 must
// alter it). The file fails with SQLSTATE 55P03 and commits nothing: Up
// leaves the version where it was, clean, says so, and a later Up
// succeeds. It left version 4 dirty, which only golang-migrate's CLI
// (migrate force 3) could clear.
func TestRefusedFileLeavesVersionClean(t *testing.T) {
	t.Parallel()
	ctx, u, admin := atVersion3(t)
	reader := connect(t, u)
	tx, err := reader.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT count(*) FROM pgfence.leases`); err != nil {
		t.Fatal(err)
	}

	err = migrations.Up(ctx, pgtest.WithSettings(u, "lock_timeout=200ms"))
	if pgerr.Code(err) != pgerr.LockNotAvailable {
		t.Fatalf("Up beside a reader of pgfence.leases, lock_timeout 200ms: %v; want SQLSTATE 55P03", err)
	}
	if errors.Is(err, migrations.ErrDirty) || !strings.Contains(err.Error(), "it changed nothing: the version is still 3") {
		t.Errorf("Up: %v; want it to say that the version is still 3", err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != 3 || dirty {
		t.Errorf("Version after the refused migration 4 = %d, dirty %v, %v; want 3, clean", v, dirty, err)
	}
	var seq bool // migration 4 drops it
	if err := admin.QueryRow(ctx, `SELECT to_regclass('pgfence.fence_seq') IS NOT NULL`).Scan(&seq); err != nil || !seq {
		t.Errorf("pgfence.fence_seq present after the refused migration 4: %v, %v; want true: nothing of it committed", seq, err)
	}

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up once the reader is done: %v", err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest(t) || dirty {
		t.Errorf("Version = %d, dirty %v, %v; want %d, clean", v, dirty, err, latest(t))
	}
}

// TestFilesAreOneTransaction: Up and Down restore the version after a file
// the server refused (it committed nothing) only because every file is one
// transaction: BEGIN first, COMMIT last, and no transaction control in
// between (outside function bodies, dollar-quoted or BEGIN ATOMIC, where
// END; closes a block).
func TestFilesAreOneTransaction(t *testing.T) {
	var (
		comment = regexp.MustCompile(`--[^\n]*`)
		body    = regexp.MustCompile(`(?s)\$([A-Za-z_]*)\$.*?\$([A-Za-z_]*)\$`)
		atomic  = regexp.MustCompile(`(?ims)\bBEGIN\s+ATOMIC\b.*?^\s*END\s*;`)
		control = regexp.MustCompile(`(?im)^\s*(BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|PREPARE\s+TRANSACTION)\b[^;]*;`)
	)
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("embedded files: %v, %v", names, err)
	}
	for _, name := range names {
		b, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		sql := comment.ReplaceAllString(string(b), "")
		sql = atomic.ReplaceAllString(body.ReplaceAllString(sql, "$$$$"), "BODY;")
		var got []string
		for _, m := range control.FindAllStringSubmatch(sql, -1) {
			got = append(got, strings.ToUpper(m[1]))
		}
		trimmed := strings.TrimSpace(sql)
		if fmt.Sprint(got) != "[BEGIN COMMIT]" || !strings.HasPrefix(trimmed, "BEGIN;") || !strings.HasSuffix(trimmed, "COMMIT;") {
			t.Errorf("%s: transaction control %v, want one BEGIN first and one COMMIT last", name, got)
		}
	}
}

// TestForceClearsDirty (scenario: the connection was lost while migration
// 4 ran, so its outcome is unknown and the version is dirty; the operator
// checks the schema, finds migration 4 absent, and records 3). Up refuses
// a dirty version; Force records 3, clean, running nothing; Up then
// applies the rest. A version that is not a migration's is refused before
// anything is written.
func TestForceClearsDirty(t *testing.T) {
	t.Parallel()
	ctx, u, admin := atVersion3(t)
	if _, err := admin.Exec(ctx, `UPDATE `+migrations.Table+` SET version = 4, dirty = true`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Up(ctx, u); !errors.Is(err, migrations.ErrDirty) {
		t.Fatalf("Up on a dirty version: %v; want ErrDirty", err)
	}
	if err := migrations.Force(ctx, u, latest(t)+1); !errors.Is(err, migrations.ErrInvalid) {
		t.Errorf("Force(%d): %v; want ErrInvalid", latest(t)+1, err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != 4 || !dirty {
		t.Errorf("Version after a refused Force = %d, dirty %v, %v; want 4, dirty: untouched", v, dirty, err)
	}
	if err := migrations.Force(ctx, u, 3); err != nil {
		t.Fatalf("Force(3): %v", err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != 3 || dirty {
		t.Errorf("Version after Force(3) = %d, dirty %v, %v; want 3, clean", v, dirty, err)
	}
	var seq bool // Force runs nothing: migration 4 would drop it
	if err := admin.QueryRow(ctx, `SELECT to_regclass('pgfence.fence_seq') IS NOT NULL`).Scan(&seq); err != nil || !seq {
		t.Errorf("pgfence.fence_seq present after Force(3): %v, %v; want true", seq, err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up after Force(3): %v", err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != latest(t) || dirty {
		t.Errorf("Version = %d, dirty %v, %v; want %d, clean", v, dirty, err, latest(t))
	}
}

// TestForceOnANewDatabase: Force 0 where nothing was ever migrated creates
// the bookkeeping table, empty, as Up would (golang-migrate's NilVersion).
func TestForceOnANewDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.EmptyURL(t)
	if err := migrations.Force(ctx, u, 0); err != nil {
		t.Fatalf("Force(0): %v", err)
	}
	var n int
	if err := connect(t, u).QueryRow(ctx, `SELECT count(*) FROM `+migrations.Table).Scan(&n); err != nil || n != 0 {
		t.Errorf("bookkeeping rows after Force(0) = %d, %v; want an empty table", n, err)
	}
	if v, dirty, err := migrations.Version(ctx, u); err != nil || v != 0 || dirty {
		t.Errorf("Version after Force(0) = %d, dirty %v, %v; want 0, clean", v, dirty, err)
	}
}
