package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5"
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/redact"
)

// FS holds the SQL migration files, named the way golang-migrate expects
// (NNNNNN_title.up.sql / NNNNNN_title.down.sql) at the root of the FS.
//
//go:embed *.sql
var FS embed.FS

// Table is golang-migrate's bookkeeping table for pgfence's migrations. It is
// distinct from golang-migrate's default (schema_migrations), so pgfence's
// history never collides with the application's own. Pass it to the upstream
// CLI as x-migrations-table=pgfence_schema_migrations.
const Table = "pgfence_schema_migrations"

// Up applies every pending migration. It is safe to run from many processes
// at once: golang-migrate serialises them with an advisory lock, and the
// ones that find the schema current return nil.
//
// databaseURL is a PostgreSQL connection string in URL or keyword/value form
// (anything pgx.ParseConfig accepts). Cancelling ctx stops after the
// migration in progress.
func Up(ctx context.Context, databaseURL string) error {
	err := withMigrate(ctx, databaseURL, func(m *migrate.Migrate) error {
		err := m.Up()
		if errors.Is(err, migrate.ErrNoChange) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// Down reverts every applied migration, removing the pgfence schema and the
// guard triggers pgfence.protect installed. It drops nothing of the
// application's: an application object that depends on pgfence makes it fail.
// The bookkeeping table Table is left in place, empty, as golang-migrate
// leaves it.
func Down(ctx context.Context, databaseURL string) error {
	err := withMigrate(ctx, databaseURL, func(m *migrate.Migrate) error {
		err := m.Down()
		if errors.Is(err, migrate.ErrNoChange) {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("migrations: down: %w", err)
	}
	return nil
}

// Version reports the applied migration version and whether the last
// migration failed half-way (dirty). It returns version 0 when none is
// applied.
func Version(ctx context.Context, databaseURL string) (version uint, dirty bool, err error) {
	err = withMigrate(ctx, databaseURL, func(m *migrate.Migrate) error {
		var verr error
		version, dirty, verr = m.Version()
		if errors.Is(verr, migrate.ErrNilVersion) {
			version, dirty = 0, false
			return nil
		}
		return verr
	})
	if err != nil {
		return 0, false, fmt.Errorf("migrations: version: %w", err)
	}
	return version, dirty, nil
}

// withMigrate opens a golang-migrate instance over the embedded files and the
// pgx/v5 driver, runs fn, and closes everything before returning. fn runs in
// a goroutine so that ctx can interrupt it gracefully between migrations; the
// goroutine is always waited for.
//
// Its errors never show the password, in whole or in part: pgx's parse
// error is not passed on (it may echo a piece of a malformed string), and
// every other error's text is redacted of what the password could be.
func withMigrate(ctx context.Context, databaseURL string, fn func(*migrate.Migrate) error) error {
	return redact.Error(runMigrate(ctx, databaseURL, fn), redact.Secrets(databaseURL))
}

// errParse replaces pgx's parse error, whose text may hold the password.
var errParse = errors.New("parse database URL: invalid connection string (not shown: it may hold a password)")

func runMigrate(ctx context.Context, databaseURL string, fn func(*migrate.Migrate) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return errParse
	}
	db := stdlib.OpenDB(*cfg)
	// The driver's Lock blocks on pg_advisory_lock without a context; ctx
	// still bounds connecting.
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return fmt.Errorf("connect: %w", err)
	}
	driver, err := migratepgx.WithInstance(db, &migratepgx.Config{MigrationsTable: Table})
	if err != nil {
		_ = db.Close()
		return fmt.Errorf("open pgx driver: %w", err)
	}
	src, err := iofs.New(FS, ".")
	if err != nil {
		_ = driver.Close()
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", driver)
	if err != nil {
		_ = src.Close()
		_ = driver.Close()
		return fmt.Errorf("init migrate: %w", err)
	}

	done := make(chan error, 1)
	go func() { done <- fn(m) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		m.GracefulStop <- true
		err = <-done
		if err == nil {
			err = ctx.Err()
		}
	}
	srcErr, dbErr := m.Close()
	return errors.Join(err, srcErr, dbErr)
}

// Latest is the version Up migrates to: the highest version in FS.
func Latest() (uint, error) {
	entries, err := FS.ReadDir(".")
	if err != nil {
		return 0, fmt.Errorf("migrations: read embedded files: %w", err)
	}
	var latest uint
	for _, e := range entries {
		var v uint
		if _, err := fmt.Sscanf(e.Name(), "%d_", &v); err == nil && v > latest {
			latest = v
		}
	}
	return latest, nil
}
