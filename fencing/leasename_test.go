package fencing_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestLeaseNamesReachTheGuardExactly: Begin splices the lease name into its
// BEGIN message (one round trip, no parameters). Names built to break out
// of a string constant, or to be read differently with
// standard_conforming_strings off, must reach the guard byte for byte: the
// write under the lease's token is accepted, nothing else runs, and the
// same write under a token whose name differs in one character is not.
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
// UTF-8, Begin's Unicode escapes still name the lease the client granted:
// PostgreSQL converts them into the database's encoding, as it converts the
// grant's parameters from client_encoding=UTF8. A client left at the
// database's encoding (pgx's default) sends Go's UTF-8 as LATIN1, so its
// grant stores another name than the one it declares: its fenced writes
// are refused, never let through.
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
	wantStale(t, write(latin1, tok, 2, "x"))
	if _, _, ok := item(t, pool, 2); ok {
		t.Fatal("a write under a mis-encoded lease name went through")
	}
}
