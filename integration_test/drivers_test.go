package integration_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx" with database/sql
	_ "github.com/lib/pq"              // registers "postgres" with database/sql

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/pglock"
)

// The cross-driver suite: the same test bodies run over every way an
// application may reach PostgreSQL — a pgx pool (pglock.New, leases.New,
// fencing.InTx) and database/sql with pgx's stdlib driver or lib/pq
// (pglock.NewDB, leases.NewDB, fencing.InDBTx). One table of drivers.

// A driver opens the library's objects over one kind of database handle.
type driver struct {
	name string
	open func(t *testing.T, u, app string) handle
}

// handle is one database handle (a pool, or a *sql.DB) of a driver, whose
// sessions carry the application_name it was opened with.
type handle struct {
	locker func(opts ...pglock.Option) (*pglock.Locker, error)
	client func(opts ...leases.Option) (*leases.Client, error)
	// fenced runs one statement in a fenced transaction declaring tok
	// (fencing.InTx or fencing.InDBTx).
	fenced func(ctx context.Context, tok fencing.Token, sql string, args ...any) error
	// inUse counts the handle's connections in use.
	inUse func() int
}

var drivers = []driver{
	{name: "pgx", open: func(t *testing.T, u, app string) handle {
		pool := newPool(t, u, app)
		return handle{
			locker: func(opts ...pglock.Option) (*pglock.Locker, error) { return pglock.New(pool, opts...) },
			client: func(opts ...leases.Option) (*leases.Client, error) { return leases.New(pool, opts...) },
			fenced: func(ctx context.Context, tok fencing.Token, q string, args ...any) error {
				return fencing.InTx(ctx, pool, tok, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, q, args...)
					return err
				})
			},
			inUse: func() int { return int(pool.Stat().AcquiredConns()) },
		}
	}},
	{name: "database/sql+pgx", open: func(t *testing.T, u, app string) handle { return sqlHandle(t, "pgx", u, app) }},
	{name: "database/sql+lib/pq", open: func(t *testing.T, u, app string) handle { return sqlHandle(t, "postgres", u, app) }},
}

// sqlHandle opens a *sql.DB with driverName over u, closed when t ends.
func sqlHandle(t *testing.T, driverName, u, app string) handle {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("parse %s: %v", u, err)
	}
	q := pu.Query()
	q.Set("application_name", app)
	pu.RawQuery = q.Encode()
	db, err := sql.Open(driverName, pu.String())
	if err != nil {
		t.Fatalf("sql.Open(%q): %v", driverName, err)
	}
	t.Cleanup(func() {
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("db %s: %d connections still in use at the end of the test", app, n)
		}
		_ = db.Close()
	})
	return handle{
		locker: func(opts ...pglock.Option) (*pglock.Locker, error) { return pglock.NewDB(db, opts...) },
		client: func(opts ...leases.Option) (*leases.Client, error) { return leases.NewDB(db, opts...) },
		fenced: func(ctx context.Context, tok fencing.Token, q string, args ...any) error {
			return fencing.InDBTx(ctx, db, tok, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, q, args...)
				return err
			})
		},
		inUse: func() int { return db.Stats().InUse },
	}
}

// forDrivers runs body as a parallel subtest per driver, each with its own
// migrated database (URL u) and an admin pool on it for inspection.
func forDrivers(t *testing.T, body func(t *testing.T, d driver, u string, admin *pgxpool.Pool)) {
	for _, d := range drivers {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			u := setup(t)
			body(t, d, u, newPool(t, u, "admin"))
		})
	}
}

func mustLocker(t *testing.T, h handle, opts ...pglock.Option) *pglock.Locker {
	t.Helper()
	l, err := h.locker(opts...)
	if err != nil {
		t.Fatalf("locker: %v", err)
	}
	return l
}

func mustClient(t *testing.T, h handle, owner string, opts ...leases.Option) *leases.Client {
	t.Helper()
	c, err := h.client(append([]leases.Option{leases.WithOwner(owner)}, opts...)...)
	if err != nil {
		t.Fatalf("leases client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
