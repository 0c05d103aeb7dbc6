package fencing_test

import (
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/fencing"
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
	err = fencing.InTx(bg, pool, tok, func(pgx.Tx) error {
		t.Error("InTx ran fn without a declaration")
		return nil
	})
	want("InTx", err)

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
