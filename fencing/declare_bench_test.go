package fencing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// pipelinedTx runs fn in a transaction whose BEGIN and declaration (decl,
// with the token's lease and fence as $1 and $2) are sent in one round
// trip, the declaration as a prepared statement (extended protocol, pgx's
// statement cache): a candidate for Begin that would need a pgx.Tx of
// pgfence's own. A sketch: no error mapping, and a ROLLBACK without a
// timeout.
func pipelinedTx(ctx context.Context, pool *pgxpool.Pool, decl string, tok fencing.Token, fn func(c *pgx.Conn) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(decl, tok.Lease, tok.Fence)
	if err := c.SendBatch(ctx, &b).Close(); err != nil {
		return err
	}
	if err := fn(c.Conn()); err != nil {
		_, _ = c.Exec(ctx, "ROLLBACK")
		return err
	}
	_, err = c.Exec(ctx, "COMMIT")
	return err
}

// BenchmarkDeclareCandidates measures ways of declaring the token against
// the unprotected transaction, at 1 and 8 goroutines (docs/performance.md,
// "Candidates for the declaration"):
//
//   - fenced: what InTx does: BEGIN, a prepared "CALL
//     pgfence.declare($1, $2)" and the UPDATE in one pipelined batch.
//   - begin: what Begin does (and InTx did before it pipelined): "BEGIN;
//     CALL pgfence.declare(...)" in one simple-protocol message
//     (migration 12), then the UPDATE.
//   - select: what InTx did before, "BEGIN; SELECT
//     pgfence.declare_token(...)", planned and answered with a row on
//     every transaction.
//   - pipe: BEGIN and a prepared SELECT declaration in one pipelined round
//     trip (pipelinedTx), which would need a pgx.Tx of pgfence's own.
//   - pipecall: the same with a prepared "CALL pgfence.declare($1, $2)".
//   - declare: InTx's declaration on an unprotected table, no guard: what
//     fencing would cost if the guard cost nothing.
//
// Each variant updates its own table, so that dead tuples left by one do
// not slow the next. Run the binary several times for interleaved sides:
//
//	go test -c -o /tmp/fencing.test ./fencing/
//	for i in $(seq 10); do /tmp/fencing.test -test.run '^$' -test.bench DeclareCandidates -test.benchtime 4000x; done
func BenchmarkDeclareCandidates(b *testing.B) {
	const rows = 800
	kinds := []string{"plain", "fenced", "begin", "select", "pipe", "pipecall", "declare"}
	pool := setup(b)
	for _, kind := range kinds {
		mustExec(b, pool, `CREATE TABLE s_`+kind+` (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence bigint NOT NULL DEFAULT 0)`)
		if kind != "plain" && kind != "declare" {
			if err := fencing.Protect(bg, pool, "s_"+kind); err != nil {
				b.Fatal(err)
			}
		}
	}
	tok := grant(b, pool, "candidates", time.Hour)
	if err := fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		for _, kind := range kinds {
			if _, err := tx.Exec(bg, `INSERT INTO s_`+kind+` (id) SELECT generate_series(1, $1::int)`, rows); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	write := func(kind string, id int) error {
		update := `UPDATE s_` + kind + ` SET v = v + 1 WHERE id = $1`
		switch kind {
		case "fenced":
			return fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
				_, err := tx.Exec(bg, update, id)
				return err
			})
		case "begin":
			tx, err := fencing.Begin(bg, pool, tok)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(bg) }()
			if _, err := tx.Exec(bg, update, id); err != nil {
				return err
			}
			return tx.Commit(bg)
		case "declare":
			return pgx.BeginTxFunc(bg, pool, pgx.TxOptions{BeginQuery: fmt.Sprintf(`BEGIN; CALL pgfence.declare('candidates', %d)`, tok.Fence)}, func(tx pgx.Tx) error {
				_, err := tx.Exec(bg, update, id)
				return err
			})
		case "select":
			return pgx.BeginTxFunc(bg, pool, pgx.TxOptions{BeginQuery: fmt.Sprintf(`BEGIN; SELECT pgfence.declare_token('candidates', %d)`, tok.Fence)}, func(tx pgx.Tx) error {
				_, err := tx.Exec(bg, update, id)
				return err
			})
		case "pipe", "pipecall":
			decl := `SELECT pgfence.declare_token($1, $2)`
			if kind == "pipecall" {
				decl = `CALL pgfence.declare($1, $2)`
			}
			return pipelinedTx(bg, pool, decl, tok, func(c *pgx.Conn) error {
				_, err := c.Exec(bg, update, id)
				return err
			})
		}
		return pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, update, id)
			return err
		})
	}
	for _, goroutines := range []int{1, 8} {
		for _, kind := range kinds {
			b.Run(fmt.Sprintf("%s/%d", kind, goroutines), func(b *testing.B) {
				pgtest.Split(b, goroutines, func(g, i int) error {
					return write(kind, g*rows/goroutines+i%(rows/goroutines)+1)
				})
			})
		}
	}
}
