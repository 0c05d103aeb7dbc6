package fencing_test

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestBeginBeforeMigration12 (scenario: the application was upgraded
// before its database). Without pgfence.declare, every way of declaring
// fails with PostgreSQL's error and a message saying to migrate, and
// leaves no transaction open on the connection.
func TestBeginBeforeMigration12(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "job", time.Minute)
	mustExec(t, pool, `DROP PROCEDURE pgfence.declare(text, bigint)`)
	want := func(what string, err error) {
		t.Helper()
		wantCode(t, err, "42883")
		if !strings.Contains(err.Error(), "run `pgfence migrate up`") {
			t.Fatalf("%s: error %q does not say to migrate", what, err)
		}
	}

	_, err := fencing.Begin(bg, pool, tok)
	want("Begin on a pool", err)
	// InTx sends the declaration with fn's first statement, which never
	// runs; InTx returns the declaration's error even if fn drops it.
	for _, drop := range []bool{false, true} {
		err = fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, upsertItem, 1, "undeclared")
			if drop {
				return nil
			}
			return err
		})
		want("InTx", err)
		err = fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
			err := tx.QueryRow(bg, upsertItem+` RETURNING fence`, 1, "undeclared").Scan(new(int64))
			want("QueryRow in InTx", err)
			if drop {
				return nil
			}
			return err
		})
		want("InTx with QueryRow", err)
	}
	if _, _, ok := item(t, pool, 1); ok {
		t.Fatal("InTx wrote without a declaration")
	}

	c, err := pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	_, err = fencing.Begin(bg, c.Conn(), tok)
	want("Begin on a *pgx.Conn", err)
	if s := c.Conn().PgConn().TxStatus(); s != 'I' {
		t.Fatalf("after the failed Begin on a *pgx.Conn: transaction status %q, want idle", s)
	}
	outer, err := c.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fencing.Begin(bg, outer, tok)
	want("Begin on a pgx.Tx", err)
	if err := outer.Rollback(bg); err != nil {
		t.Fatal(err)
	}

	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	_, err = fencing.BeginDB(bg, db, tok, nil)
	want("BeginDB", err)
	err = fencing.InDBTx(bg, db, tok, func(*sql.Tx) error {
		t.Error("InDBTx ran fn without a declaration")
		return nil
	})
	want("InDBTx", err)
	if n := db.Stats().InUse; n != 0 {
		t.Fatalf("%d database/sql connections in use after the failed declarations", n)
	}
}

// TestFailedDeclarationOnAPoolConnRollsBack (scenario: a worker pins a
// connection with pool.Acquire and declares on it, in a database without
// pgfence.declare). A *pgxpool.Conn can BeginTx, so Begin sends BEGIN and
// the declaration in one message and the failed CALL leaves the
// connection inside an aborted transaction. Begin and InTx roll it back,
// as they promise: the pinned connection is idle afterwards and its next
// statement runs.
func TestFailedDeclarationOnAPoolConnRollsBack(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "job", time.Minute)
	mustExec(t, pool, `DROP PROCEDURE pgfence.declare(text, bigint)`)
	c, err := pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	wantIdle := func(what string, err error) {
		t.Helper()
		wantCode(t, err, "42883")
		if s := c.Conn().PgConn().TxStatus(); s != 'I' {
			t.Fatalf("after the failed %s on a *pgxpool.Conn: transaction status %q, want idle", what, s)
		}
		if _, err := c.Exec(bg, `SELECT 1`); err != nil {
			t.Fatalf("the next statement after the failed %s: %v", what, err)
		}
	}

	err = fencing.InTx(bg, c, tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, upsertItem, 1, "undeclared")
		return err
	})
	wantIdle("InTx", err)
	if _, _, ok := item(t, pool, 1); ok {
		t.Fatal("InTx wrote without a declaration")
	}
	_, err = fencing.Begin(bg, c, tok)
	wantIdle("Begin", err)
}

// TestDeclareInEveryExecMode: the declaration, a CALL with parameters on a
// pgx.Tx, works in each of pgx's query exec modes (a pooler needs one of
// the modes without prepared statements, docs/production.md), and so does
// InTx on a pool configured with that mode: a current token writes, a
// stale one is refused.
func TestDeclareInEveryExecMode(t *testing.T) {
	t.Parallel()
	base := setup(t)
	u := base.Config().ConnString()
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			pool := pgtest.PoolFor(t, u, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			lease := "mode/" + mode.String()
			old := grant(t, pool, lease, time.Minute)
			expire(t, pool, lease)
			tok := grant(t, pool, lease, time.Minute)
			id := int(mode) + 1
			if err := write(pool, tok, id, "intx"); err != nil {
				t.Fatalf("InTx: %v", err)
			}
			wantStaleTx(t, write(pool, old, id, "stale"), old)
			err := pgx.BeginFunc(bg, pool, func(outer pgx.Tx) error {
				tx, err := fencing.Begin(bg, outer, tok)
				if err != nil {
					return fmt.Errorf("Begin on a pgx.Tx: %w", err)
				}
				if _, err := tx.Exec(bg, upsertItem, id, "savepoint"); err != nil {
					return err
				}
				return tx.Commit(bg)
			})
			if err != nil {
				t.Fatal(err)
			}
			wantItem(t, pool, id, "savepoint", tok.Fence)
		})
	}
}
