package fencing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestMain provides DATABASE_URL to the Examples, which connect the way an
// application does.
func TestMain(m *testing.M) { pgtest.MainWithURL(m, "DATABASE_URL") }

// The handles the package documents as DBs.
var (
	_ fencing.DB = (*pgxpool.Pool)(nil)
	_ fencing.DB = (*pgx.Conn)(nil)
	_ fencing.DB = pgx.Tx(nil)
)

// Test SQL. Leases are granted with pgfence.try_acquire and expired with
// plain SQL on pgfence.leases (the tests run as the owner), so these tests
// depend only on the schema.
const (
	createItems = `CREATE TABLE items (id int PRIMARY KEY, v text NOT NULL, fence bigint NOT NULL DEFAULT 0)`
	// upsertItem is the write under test: an INSERT when the row is
	// absent, an UPDATE when it exists (the guard checks both).
	upsertItem = `INSERT INTO items (id, v) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET v = excluded.v`
	selectItem = `SELECT v, fence FROM items WHERE id = $1`

	// grantLease grants name for ttl to owner if it is free or expired
	// (database clock), with a new fence; no row means it is held.
	grantLease  = `SELECT fence FROM pgfence.try_acquire($1, $2, $3) WHERE granted`
	expireLease = `UPDATE pgfence.leases SET expires_at = clock_timestamp() WHERE name = $1`
)

var bg = context.Background()

// setup returns a pool over a fresh database holding a protected table
// "items".
func setup(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	mustExec(t, pool, createItems)
	if err := fencing.Protect(bg, pool, "items"); err != nil {
		t.Fatalf("Protect: %v", err)
	}
	return pool // pgtest checks at cleanup that no connection is still acquired
}

func mustExec(t testing.TB, db fencing.DB, sql string, args ...any) {
	t.Helper()
	if _, err := db.Exec(bg, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// grant grants lease name for ttl and returns its token; the lease must be
// free or expired.
func grant(t testing.TB, db fencing.DB, name string, ttl time.Duration) fencing.Token {
	t.Helper()
	tok, ok, err := tryGrant(bg, db, name, ttl)
	if err != nil {
		t.Fatalf("grant %s: %v", name, err)
	}
	if !ok {
		t.Fatalf("grant %s: held by someone else", name)
	}
	return tok
}

func tryGrant(ctx context.Context, db fencing.DB, name string, ttl time.Duration) (fencing.Token, bool, error) {
	tx, err := db.Begin(ctx) // db is a Pool or Conn here; Begin gives us QueryRow
	if err != nil {
		return fencing.Token{}, false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var fence int64
	err = tx.QueryRow(ctx, grantLease, name, "owner-"+name, ttl.Microseconds()).Scan(&fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return fencing.Token{}, false, nil
	}
	if err != nil {
		return fencing.Token{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return fencing.Token{}, false, err
	}
	return fencing.Token{Lease: name, Fence: fence}, true, nil
}

func expire(t testing.TB, db fencing.DB, name string) {
	t.Helper()
	mustExec(t, db, expireLease, name)
}

// item reads row id of items; ok is false if it does not exist.
func item(t testing.TB, db *pgxpool.Pool, id int) (v string, fence int64, ok bool) {
	t.Helper()
	err := db.QueryRow(bg, selectItem, id).Scan(&v, &fence)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, false
	}
	if err != nil {
		t.Fatalf("read item %d: %v", id, err)
	}
	return v, fence, true
}

// wantItem fails t unless row id holds v written with fence.
func wantItem(t testing.TB, db *pgxpool.Pool, id int, v string, fence int64) {
	t.Helper()
	gotV, gotFence, ok := item(t, db, id)
	if !ok || gotV != v || gotFence != fence {
		t.Fatalf("item %d = (%q, fence %d, exists %v), want (%q, fence %d)", id, gotV, gotFence, ok, v, fence)
	}
}

// wantStale fails t unless err is the guard's stale rejection, matched every
// way the package documents.
func wantStale(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("write succeeded, want it rejected as stale")
	}
	if !fencing.IsStale(err) {
		t.Fatalf("IsStale(%v) = false, want true", err)
	}
	if fencing.IsNoToken(err) {
		t.Fatalf("IsNoToken(%v) = true for a stale token", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != fencing.SQLStateStale {
		t.Fatalf("err = %v, want a *pgconn.PgError with SQLSTATE %s in its chain", err, fencing.SQLStateStale)
	}
}

// wantStaleTx is wantStale for errors from InTx, which must also match
// ErrStale and carry a *StaleError.
func wantStaleTx(t testing.TB, err error, tok fencing.Token) {
	t.Helper()
	wantStale(t, err)
	if !errors.Is(err, fencing.ErrStale) {
		t.Fatalf("errors.Is(%v, ErrStale) = false", err)
	}
	var se *fencing.StaleError
	if !errors.As(err, &se) || se.Token != tok || se.PgError == nil || se.PgError.Code != fencing.SQLStateStale {
		t.Fatalf("err = %#v, want a *StaleError for %v carrying the PgError", err, tok)
	}
}

// write runs upsertItem(id, v) in InTx with tok and opts.
func write(db fencing.DB, tok fencing.Token, id int, v string, opts ...fencing.Option) error {
	return fencing.InTx(bg, db, tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, upsertItem, id, v)
		return err
	}, opts...)
}
