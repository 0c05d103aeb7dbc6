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

	"github.com/pgfence/pgfence/internal/pgerr"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestRefusedFileLeavesVersionClean (scenario: the migration role sets
// lock_timeout, as is common for DDL on a busy database, and an
// application transaction reads pgfence.leases while migration 4 must
// alter it). The file fails with SQLSTATE 55P03 and commits nothing: Up
// leaves the version where it was, clean, says so, and a later Up
// succeeds. It left version 4 dirty, which only golang-migrate's CLI
// (migrate force 3) could clear.
func TestRefusedFileLeavesVersionClean(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	u := pgtest.EmptyURL(t)
	admin := connect(t, u)
	upTo(t, ctx, admin, 3)
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
