package fencing_test

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
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
