package fencing_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// BenchmarkFencedUpdate measures what fencing costs one UPDATE of one row:
//
//	plain           BEGIN; UPDATE (unprotected table); COMMIT
//	plain+declare   the same plus the token declaration (one round trip), no guard
//	fenced          InTx with a lease token on a protected table: declaration,
//	                guard with the lease check and share lock
//	fenced-no-lease InTx with a fence-only token: declaration, guard, no lease check
//	guarded-sql     one autocommit statement: the lease-checked plain-SQL UPDATE
//	                on an unprotected table
//
// Run: go test -run '^$' -bench FencedUpdate -benchtime 3s ./fencing/
func BenchmarkFencedUpdate(b *testing.B) {
	pool := setup(b)
	// Each variant updates its own table, so that dead tuples left by one
	// do not slow the next.
	const rows = 100
	for _, table := range []string{"plain_a", "plain_b", "fenced_a", "fenced_b"} {
		mustExec(b, pool, `CREATE TABLE `+table+` (id int PRIMARY KEY, v text NOT NULL, fence bigint NOT NULL DEFAULT 0)`)
	}
	for _, table := range []string{"fenced_a", "fenced_b"} {
		if err := fencing.Protect(bg, pool, table); err != nil {
			b.Fatal(err)
		}
	}
	mustExec(b, pool, createAccounts)
	mustExec(b, pool, `INSERT INTO accounts (id, balance) SELECT g, 0 FROM generate_series(1, $1) g`, rows)
	tok := grant(b, pool, "bench", time.Hour)
	if err := fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		for _, table := range []string{"plain_a", "plain_b", "fenced_a", "fenced_b"} {
			if _, err := tx.Exec(bg, `INSERT INTO `+table+` (id, v) SELECT g, 'x' FROM generate_series(1, $1) g`, rows); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	update := func(table string) string { return `UPDATE ` + table + ` SET v = $2 WHERE id = $1` }
	run := func(name string, once func(i int) error) {
		b.Run(name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				if err := once(i%rows + 1); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
	run("plain", func(id int) error {
		return pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, update("plain_a"), id, "y")
			return err
		})
	})
	run("plain+declare", func(id int) error {
		return pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(bg, `SELECT pgfence.declare_token($1, $2)`, tok.Lease, tok.Fence); err != nil {
				return err
			}
			_, err := tx.Exec(bg, update("plain_b"), id, "y")
			return err
		})
	})
	run("fenced", func(id int) error {
		return fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, update("fenced_a"), id, "y")
			return err
		})
	})
	run("guarded-sql", func(id int) error {
		tag, err := pool.Exec(bg, leaseGuardedUpdate, id, 1, tok.Fence, tok.Lease)
		if err == nil && tag.RowsAffected() != 1 {
			b.Fatalf("guarded update affected %d rows", tag.RowsAffected())
		}
		return err
	})
}

// BenchmarkManyWriters measures 8 goroutines writing under one lease: each
// updates its own rows, fenced (InTx with the same token, on a protected
// table) or plain (BEGIN; UPDATE; COMMIT on an unprotected one). The fenced
// side also reports the MultiXacts the cluster created per 10,000 writes:
// share locks that several transactions hold on one row at once need a
// MultiXact each, and the fence lock is an advisory lock so that none are
// (the cluster-wide counter, read after a CHECKPOINT: run it alone).
//
// Run: go test -run '^$' -bench ManyWriters -benchtime 10000x ./fencing/
func BenchmarkManyWriters(b *testing.B) {
	const goroutines, rows = 8, 800
	pool := setup(b)
	for _, table := range []string{"many_plain", "many_fenced"} {
		mustExec(b, pool, `CREATE TABLE `+table+` (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence bigint NOT NULL DEFAULT 0)`)
	}
	if err := fencing.Protect(bg, pool, "many_fenced"); err != nil {
		b.Fatal(err)
	}
	tok := grant(b, pool, "many", time.Hour)
	if err := fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		for _, table := range []string{"many_plain", "many_fenced"} {
			if _, err := tx.Exec(bg, `INSERT INTO `+table+` (id) SELECT generate_series(1, $1::int)`, rows); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	nextMulti := func() int64 {
		mustExec(b, pool, `CHECKPOINT`)
		var id int64
		if err := pool.QueryRow(bg, `SELECT next_multixact_id::text::bigint FROM pg_control_checkpoint()`).Scan(&id); err != nil {
			b.Fatal(err)
		}
		return id
	}
	write := func(fenced bool, g, i int) error {
		id := g*rows/goroutines + i%(rows/goroutines) + 1
		if fenced {
			return fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
				_, err := tx.Exec(bg, `UPDATE many_fenced SET v = v + 1 WHERE id = $1`, id)
				return err
			})
		}
		return pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, `UPDATE many_plain SET v = v + 1 WHERE id = $1`, id)
			return err
		})
	}
	for _, fenced := range []bool{false, true} {
		name := "plain"
		if fenced {
			name = "fenced"
		}
		b.Run(name, func(b *testing.B) {
			before := nextMulti()
			b.ResetTimer()
			pgtest.Split(b, goroutines, func(g, i int) error { return write(fenced, g, i) })
			b.StopTimer()
			b.ReportMetric(float64(nextMulti()-before)*10000/float64(b.N), "multixacts/10k-writes")
		})
	}
}
