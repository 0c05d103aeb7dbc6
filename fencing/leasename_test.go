package fencing_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestLeaseNamesReachTheGuardExactly: Begin splices an ASCII lease name
// into its BEGIN message (one round trip, no parameters), and sends any
// other as a parameter. Names built to break out of a string constant, or
// to be read differently with standard_conforming_strings off, must reach
// the guard byte for byte either way: the write under the lease's token is
// accepted, nothing else runs, and the same write under a token whose name
// differs in one character is not.
func TestLeaseNamesReachTheGuardExactly(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	names := []string{
		`o'brien`, `back\slash`, `\'`, `''`, `\\'`, `E'\x41'`, `$$dollar$$`,
		`x', 1); CREATE TABLE pwned (); --`,
		`x\'); CREATE TABLE pwned (); --`,
		"ünïcode", "emoji 🦀", "tab\tnew\nline\r", "del\x7f", "line\u2028sep",
		strings.Repeat("é", 95), // 190 bytes of two-byte characters
	}
	for _, scs := range []string{"on", "off"} {
		conn, err := pgx.ConnectConfig(bg, pool.Config().ConnConfig.Copy())
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, conn, `SET standard_conforming_strings = `+scs)
		for i, name := range names {
			id := i + 1
			if scs == "off" {
				id += len(names)
			}
			tok := grant(t, pool, name+" "+scs, time.Minute)
			if err := write(conn, tok, id, "x"); err != nil {
				t.Fatalf("standard_conforming_strings %s: write under %q: %v", scs, tok.Lease, err)
			}
			wantItem(t, pool, id, "x", tok.Fence)
			other := fencing.Token{Lease: tok.Lease[:len(tok.Lease)-1] + "X", Fence: tok.Fence}
			wantStale(t, write(conn, other, id, "y"))
		}
		conn.Close(bg)
	}
	var pwned bool
	if err := pool.QueryRow(bg, `SELECT to_regclass('pwned') IS NOT NULL`).Scan(&pwned); err != nil {
		t.Fatal(err)
	}
	if pwned {
		t.Fatal("a lease name ran a statement")
	}
}

// TestLeaseNamesInALatin1Database: in a database whose encoding is not
// UTF-8, Begin declares a non-ASCII lease name as the grant sent it, as a
// parameter, which PostgreSQL converts from client_encoding=UTF8 into the
// database's encoding: the write under the lease's token goes through, and
// one under a name a character off is refused. A client left at the
// database's encoding (pgx's default) sends Go's UTF-8 as LATIN1: its
// grant and its declarations agree, so its writes go through, but the
// lease it holds is another name than the one it chose, and a token for
// that name is refused.
func TestLeaseNamesInALatin1Database(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptyURLEncoded(t, "LATIN1")
	if err := migrations.Up(bg, u); err != nil {
		t.Fatal(err)
	}
	latin1 := pgtest.PoolFor(t, u)
	pool := pgtest.PoolFor(t, u, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["client_encoding"] = "UTF8" })
	mustExec(t, pool, createItems)
	if err := fencing.Protect(bg, pool, "items"); err != nil {
		t.Fatal(err)
	}
	var enc string
	if err := pool.QueryRow(bg, `SELECT pg_encoding_to_char(encoding) FROM pg_database WHERE datname = current_database()`).Scan(&enc); err != nil || enc != "LATIN1" {
		t.Fatalf("database encoding %q, %v; want LATIN1", enc, err)
	}
	tok := grant(t, pool, "ünïcode £ é", time.Minute)
	if err := write(pool, tok, 1, "x"); err != nil {
		t.Fatalf("write under %q: %v", tok.Lease, err)
	}
	wantItem(t, pool, 1, "x", tok.Fence)
	wantStale(t, write(pool, fencing.Token{Lease: "ünïcode £ e", Fence: tok.Fence}, 1, "y"))

	tok = grant(t, latin1, "naïve", time.Minute)
	if err := write(latin1, tok, 2, "x"); err != nil {
		t.Fatalf("write under %q through a LATIN1 connection: %v", tok.Lease, err)
	}
	wantItem(t, pool, 2, "x", tok.Fence)
	var stored string
	if err := pool.QueryRow(bg, `SELECT name FROM pgfence.leases WHERE fence = $1`, tok.Fence).Scan(&stored); err != nil || stored != "naÃ¯ve" {
		t.Fatalf("lease granted through a LATIN1 connection stored as %q, %v; want the mis-encoded %q", stored, err, "naÃ¯ve")
	}
	wantStale(t, write(pool, tok, 2, "y"))
}

// TestLeaseNamesInASQLASCIIDatabase: a SQL_ASCII database converts
// nothing; it stores the bytes the client sends. A lease granted there
// under a non-ASCII name (through parameters, as leases grants) is
// declared under the same bytes by Begin and InTx on every kind of handle
// — a pool, a pinned *pgxpool.Conn, a *pgx.Conn, a pgx.Tx — so its writes
// go through, and a name one character off is still refused. (PostgreSQL
// cannot convert a Unicode escape to SQL_ASCII: the one-message BEGIN must
// not spell such a name with them.) An ASCII name with control characters,
// which that BEGIN does escape, works too.
func TestLeaseNamesInASQLASCIIDatabase(t *testing.T) {
	t.Parallel()
	u := pgtest.EmptyURLEncoded(t, "SQL_ASCII")
	if err := migrations.Up(bg, u); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolFor(t, u, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["client_encoding"] = "UTF8" })
	mustExec(t, pool, createItems)
	if err := fencing.Protect(bg, pool, "items"); err != nil {
		t.Fatal(err)
	}
	c, err := pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	handles := []struct {
		name string
		db   fencing.DB
	}{{"pool", pool}, {"*pgxpool.Conn", c}, {"*pgx.Conn", c.Conn()}}
	id := 0
	for _, name := range []string{"café", "emoji 🦀", "tab\there\x7f"} {
		tok := grant(t, pool, name, time.Minute)
		for _, h := range handles {
			id++
			if err := write(h.db, tok, id, h.name); err != nil {
				t.Fatalf("InTx on a %s under %q: %v", h.name, tok.Lease, err)
			}
			wantItem(t, pool, id, h.name, tok.Fence)
		}
		id++
		if err := pgx.BeginFunc(bg, pool, func(outer pgx.Tx) error {
			return write(outer, tok, id, "pgx.Tx")
		}); err != nil {
			t.Fatalf("InTx on a pgx.Tx under %q: %v", tok.Lease, err)
		}
		wantItem(t, pool, id, "pgx.Tx", tok.Fence)
		r := []rune(tok.Lease)
		other := fencing.Token{Lease: string(r[:len(r)-1]) + "X", Fence: tok.Fence}
		wantStale(t, write(pool, other, id, "other"))
	}
}

// TestDeclarationRefusedInTheDatabaseEncoding: a lease name Token.Validate
// accepts (200 bytes of UTF-8) can be longer in the database's encoding —
// "é" takes two bytes in UTF-8 and three in EUC_JP — and then
// pgfence.declare refuses it (PF002). Begin and InTx on every kind of
// handle, and BeginDB, must say ErrNoToken, as a write that declares no
// token does, and leave no transaction open.
func TestDeclarationRefusedInTheDatabaseEncoding(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(bg) })
	counted := fencing.WithMeterProvider(mp)
	u := pgtest.EmptyURLEncoded(t, "EUC_JP")
	if err := migrations.Up(bg, u); err != nil {
		t.Fatal(err)
	}
	pool := pgtest.PoolFor(t, u, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["client_encoding"] = "UTF8" })
	tok := fencing.Token{Lease: strings.Repeat("é", 100), Fence: 1}
	if err := tok.Validate(); err != nil {
		t.Fatalf("token of %d bytes of UTF-8: %v", len(tok.Lease), err)
	}
	var n int
	if err := pool.QueryRow(bg, `SELECT octet_length($1::text)`, tok.Lease).Scan(&n); err != nil || n <= 200 {
		t.Fatalf("octet_length in EUC_JP = %d, %v; want over 200", n, err)
	}
	c, err := pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	for _, h := range []struct {
		name string
		db   fencing.DB
	}{{"pool", pool}, {"*pgxpool.Conn", c}, {"*pgx.Conn", c.Conn()}} {
		tx, err := fencing.Begin(bg, h.db, tok)
		if tx != nil || !errors.Is(err, fencing.ErrNoToken) || fencing.IsStale(err) {
			t.Errorf("Begin on a %s = %v, %v; want an error wrapping ErrNoToken", h.name, tx, err)
		}
		if err := fencing.InTx(bg, h.db, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, `SELECT $1::int`, 1) // sends the declaration
			return err
		}, counted); !errors.Is(err, fencing.ErrNoToken) {
			t.Errorf("InTx on a %s = %v; want an error wrapping ErrNoToken", h.name, err)
		}
		if s := c.Conn().PgConn().TxStatus(); s != 'I' {
			t.Errorf("after Begin on a %s: transaction status %q, want idle", h.name, s)
		}
	}
	if err := pgx.BeginFunc(bg, c, func(outer pgx.Tx) error {
		_, err := fencing.Begin(bg, outer, tok)
		return err
	}); !errors.Is(err, fencing.ErrNoToken) {
		t.Errorf("Begin on a pgx.Tx = %v; want an error wrapping ErrNoToken", err)
	}
	if err := pgx.BeginFunc(bg, c, func(outer pgx.Tx) error {
		return fencing.InTx(bg, outer, tok, func(pgx.Tx) error { return nil }, counted)
	}); !errors.Is(err, fencing.ErrNoToken) {
		t.Errorf("InTx on a pgx.Tx = %v; want an error wrapping ErrNoToken", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	if tx, err := fencing.BeginDB(bg, db, tok, nil); tx != nil || !errors.Is(err, fencing.ErrNoToken) {
		t.Errorf("BeginDB = %v, %v; want an error wrapping ErrNoToken", tx, err)
	}
	if err := fencing.InDBTx(bg, db, tok, func(*sql.Tx) error { return nil }, counted); !errors.Is(err, fencing.ErrNoToken) {
		t.Errorf("InDBTx = %v; want an error wrapping ErrNoToken", err)
	}
	// Each refusal InTx and InDBTx return is counted, whether it came
	// before fn (Begin's) or from fn's first call (the lazy InTx's).
	if got := rejected(t, reader); got["no_token"] != 5 || len(got) != 1 {
		t.Errorf("rejected = %v, want map[no_token:5]", got)
	}
}
