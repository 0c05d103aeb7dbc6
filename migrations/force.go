package migrations

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Force records version as the applied one, clean, and runs no file:
// golang-migrate's force, for an operator who has checked by hand what a
// migration left dirty (ErrDirty) did to the schema. version is 0 (none)
// or the version of one of the migrations in FS; any other returns an
// error matching ErrInvalid before anything is sent. Like Up, it waits
// for the migration lock (ctx bounds the wait) and creates the
// bookkeeping table when it is missing.
func Force(ctx context.Context, databaseURL string, version uint) error {
	if err := checkVersion(version); err != nil {
		return fmt.Errorf("migrations: force: %w", err)
	}
	err := withLock(ctx, databaseURL, nil, func(conn *pgx.Conn, b bookkeeping) error {
		return b.set(ctx, conn, version, false)
	})
	if err != nil {
		return fmt.Errorf("migrations: force: %w", err)
	}
	return nil
}

// checkVersion accepts 0 and the versions of the migrations in FS.
func checkVersion(version uint) error {
	ms, err := load()
	if err != nil {
		return err
	}
	if version == 0 {
		return nil
	}
	for _, m := range ms {
		if m.version == version {
			return nil
		}
	}
	return fmt.Errorf("%w: version %d is not one of pgfence's migrations (0 to %d)", ErrInvalid, version, ms[len(ms)-1].version)
}
