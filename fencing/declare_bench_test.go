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

// pipelinedTx runs fn in a transaction whose BEGIN and declaration are
// sent in one round trip, the declaration as a prepared statement
// (extended protocol, pgx's statement cache): a candidate for Begin that
// would need a pgx.Tx of pgfence's own.
func pipelinedTx(ctx context.Context, pool *pgxpool.Pool, tok fencing.Token, fn func(c *pgx.Conn) error) error {
	c, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue("SELECT pgfence.declare_token($1, $2)", tok.Lease, tok.Fence)
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

// BenchmarkDeclareCandidates measures two candidate ways of declaring the
// token against what InTx does (a simple-protocol "BEGIN; SELECT
// pgfence.declare_token(...)", parsed and planned every time) and against
// the unprotected transaction, at 1 and 8 goroutines (docs/performance.md,
// "Candidates for the declaration"):
//
//   - pipe: BEGIN and a prepared declaration in one pipelined round trip
//     (pipelinedTx).
//   - exec: pgx's own transaction with BeginQuery "BEGIN; EXECUTE
//     pgfence_declare(...)", the statement prepared on each connection by
//     the pool's AfterConnect.
//
// Neither is what the package does. Each variant updates its own table,
// so that dead tuples left by one do not slow the next. Run the binary
// several times for interleaved sides:
//
//	go test -c -o /tmp/fencing.test ./fencing/
//	for i in $(seq 10); do /tmp/fencing.test -test.run '^$' -test.bench DeclareCandidates -test.benchtime 4000x; done
func BenchmarkDeclareCandidates(b *testing.B) {
	const rows = 800
	pool := setup(b)
	epool := pgtest.PoolFor(b, pool.Config().ConnString(), func(cfg *pgxpool.Config) {
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			_, err := c.Exec(ctx, `PREPARE pgfence_declare(text, bigint) AS SELECT pgfence.declare_token($1, $2)`)
			return err
		}
	})
	for _, table := range []string{"s_plain", "s_fenced", "s_pipe", "s_exec"} {
		mustExec(b, pool, `CREATE TABLE `+table+` (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0, fence bigint NOT NULL DEFAULT 0)`)
	}
	for _, table := range []string{"s_fenced", "s_pipe", "s_exec"} {
		if err := fencing.Protect(bg, pool, table); err != nil {
			b.Fatal(err)
		}
	}
	tok := grant(b, pool, "candidates", time.Hour)
	if err := fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		for _, table := range []string{"s_plain", "s_fenced", "s_pipe", "s_exec"} {
			if _, err := tx.Exec(bg, `INSERT INTO `+table+` (id) SELECT generate_series(1, $1::int)`, rows); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	write := func(kind string, id int) error {
		switch kind {
		case "fenced":
			return fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
				_, err := tx.Exec(bg, `UPDATE s_fenced SET v = v + 1 WHERE id = $1`, id)
				return err
			})
		case "exec":
			return pgx.BeginTxFunc(bg, epool, pgx.TxOptions{BeginQuery: fmt.Sprintf(`BEGIN; EXECUTE pgfence_declare('candidates', %d)`, tok.Fence)}, func(tx pgx.Tx) error {
				_, err := tx.Exec(bg, `UPDATE s_exec SET v = v + 1 WHERE id = $1`, id)
				return err
			})
		case "pipe":
			return pipelinedTx(bg, pool, tok, func(c *pgx.Conn) error {
				_, err := c.Exec(bg, `UPDATE s_pipe SET v = v + 1 WHERE id = $1`, id)
				return err
			})
		}
		return pgx.BeginFunc(bg, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, `UPDATE s_plain SET v = v + 1 WHERE id = $1`, id)
			return err
		})
	}
	for _, goroutines := range []int{1, 8} {
		for _, kind := range []string{"plain", "fenced", "pipe", "exec"} {
			b.Run(fmt.Sprintf("%s/%d", kind, goroutines), func(b *testing.B) {
				pgtest.Split(b, goroutines, func(g, i int) error {
					return write(kind, g*rows/goroutines+i%(rows/goroutines)+1)
				})
			})
		}
	}
}
