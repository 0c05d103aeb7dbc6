package fencing_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
)

// writer is one way a client writes a row through the guard.
type writer struct {
	name  string
	write func(t *testing.T, pool *pgxpool.Pool, tok fencing.Token, id int, v string) error
}

var writers = []writer{
	{"InTx", func(t *testing.T, pool *pgxpool.Pool, tok fencing.Token, id int, v string) error {
		return write(pool, tok, id, v)
	}},
	{"PlainSQL", func(t *testing.T, pool *pgxpool.Pool, tok fencing.Token, id int, v string) error {
		return plainWrite(t, pool, tok, id, v)
	}},
}

// plainWrite writes like a client that does not use this package: on a raw
// connection, BEGIN; declare the token with pgfence.declare_token; write;
// COMMIT.
func plainWrite(t *testing.T, pool *pgxpool.Pool, tok fencing.Token, id int, v string) error {
	t.Helper()
	conn, err := pgx.ConnectConfig(bg, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(bg)
	mustExec(t, conn, "BEGIN")
	mustExec(t, conn, `SELECT pgfence.declare_token($1, $2)`, tok.Lease, tok.Fence)
	if _, err := conn.Exec(bg, upsertItem, id, v); err != nil {
		mustExec(t, conn, "ROLLBACK")
		return err
	}
	mustExec(t, conn, "COMMIT")
	return nil
}

// TestKleppmann plays Kleppmann's paused client in one process: client A
// holds the lease with fence n and pauses; its lease expires; client B is
// granted n+1. Whatever A then writes with n is rejected — before B writes
// (the lease check: n is no longer the lease's current, unexpired fence)
// and after (also the row check: n is below the row's fence n+1) — whether
// the row existed before, and whether A writes through InTx or plain SQL.
func TestKleppmann(t *testing.T) {
	t.Parallel()
	for _, w := range writers {
		for _, existed := range []bool{false, true} {
			for _, aAfterB := range []bool{false, true} {
				name := fmt.Sprintf("%s/existed=%v/AafterB=%v", w.name, existed, aAfterB)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					pool := setup(t)
					const id = 1
					var before fencing.Token
					if existed {
						before = grant(t, pool, "earlier", time.Minute)
						if err := write(pool, before, id, "before"); err != nil {
							t.Fatal(err)
						}
					}
					a := grant(t, pool, "job", time.Minute)
					// A pauses (GC, SIGSTOP) beyond its TTL: the lease
					// expires by the database clock and B takes over.
					expire(t, pool, "job")
					b := grant(t, pool, "job", time.Minute)
					if b.Fence <= a.Fence {
						t.Fatalf("B's fence %d is not above A's %d", b.Fence, a.Fence)
					}
					if aAfterB {
						if err := w.write(t, pool, b, id, "B"); err != nil {
							t.Fatalf("B's write: %v", err)
						}
					}
					err := w.write(t, pool, a, id, "A")
					if w.name == "InTx" {
						wantStaleTx(t, err, a)
					} else {
						wantStale(t, err)
					}
					switch {
					case aAfterB:
						wantItem(t, pool, id, "B", b.Fence)
					case existed:
						wantItem(t, pool, id, "before", before.Fence)
					default:
						if _, _, ok := item(t, pool, id); ok {
							t.Fatal("A's rejected INSERT left a row")
						}
					}
					if !aAfterB {
						// B is unaffected by A's attempt.
						if err := w.write(t, pool, b, id, "B"); err != nil {
							t.Fatalf("B's write after A's rejection: %v", err)
						}
						wantItem(t, pool, id, "B", b.Fence)
					}
				})
			}
		}
	}
}

// TestExpiredNoSuccessor: a lease that expired with nobody taking over is
// still not a licence to write — expiry is judged by the database clock at
// the write.
func TestExpiredNoSuccessor(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	a := grant(t, pool, "job", time.Minute)
	if err := write(pool, a, 1, "A1"); err != nil {
		t.Fatalf("write while held: %v", err)
	}
	expire(t, pool, "job")
	wantStaleTx(t, write(pool, a, 1, "A2"), a)
	wantItem(t, pool, 1, "A1", a.Fence)
}

// TestForgedFence: a token claiming a fence above the lease's current one is
// not the current grant either.
func TestForgedFence(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	a := grant(t, pool, "job", time.Minute)
	forged := fencing.Token{Lease: "job", Fence: a.Fence + 1}
	wantStaleTx(t, write(pool, forged, 1, "x"), forged)
	unknown := fencing.Token{Lease: "no-such-lease", Fence: a.Fence}
	wantStaleTx(t, write(pool, unknown, 1, "x"), unknown)
}

// TestRowFenceRule covers the row comparison: a token lower than the
// fence stored in the row is rejected even while its lease is current (a
// later grant of another lease wrote the row), and equal or higher fences
// are accepted. Leases granted one after another get increasing fences.
func TestRowFenceRule(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	var tok [9]fencing.Token
	for i := 1; i < len(tok); i++ {
		tok[i] = grant(t, pool, "job-"+strconv.Itoa(i), time.Minute)
		if tok[i].Fence <= tok[i-1].Fence {
			t.Fatalf("grant %d got fence %d, not above %d", i, tok[i].Fence, tok[i-1].Fence)
		}
	}
	if err := write(pool, tok[5], 1, "five"); err != nil {
		t.Fatal(err)
	}
	wantStaleTx(t, write(pool, tok[4], 1, "four"), tok[4])
	wantItem(t, pool, 1, "five", tok[5].Fence)
	if err := write(pool, tok[5], 1, "five again"); err != nil {
		t.Fatalf("same fence again: %v", err)
	}
	if err := write(pool, tok[7], 1, "seven"); err != nil {
		t.Fatalf("higher fence: %v", err)
	}
	wantItem(t, pool, 1, "seven", tok[7].Fence)
	// DELETE is checked too.
	err := fencing.InTx(bg, pool, tok[6], func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, `DELETE FROM items WHERE id = 1`)
		return err
	})
	wantStaleTx(t, err, tok[6])
	wantItem(t, pool, 1, "seven", tok[7].Fence)
	// One stale row rejects the whole statement.
	if err := write(pool, tok[3], 2, "three"); err != nil {
		t.Fatal(err)
	}
	err = fencing.InTx(bg, pool, tok[6], func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, `UPDATE items SET v = 'six'`)
		return err
	})
	wantStaleTx(t, err, tok[6])
	wantItem(t, pool, 2, "three", tok[3].Fence)
	// The guard stamps the row with the token, whatever the write says.
	err = fencing.InTx(bg, pool, tok[8], func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, `UPDATE items SET v = 'eight', fence = 1 WHERE id = 1`)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantItem(t, pool, 1, "eight", tok[8].Fence)
}
