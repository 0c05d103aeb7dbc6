package leases

import (
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A batched renewal renews the leases it is given and loses the one whose
// grant is gone, in every query exec mode of pgx (which encodes the array
// arguments differently in each) and over database/sql, and the buffers
// the keepalive reuses keep nothing of a batch once it is done.
func TestRenewBatchModes(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) { cfg.ConnConfig.DefaultQueryExecMode = mode })
			testRenewBatch(t, freeze(newClient(t, pool)), mode.String())
		})
	}
	t.Run("database/sql", func(t *testing.T) {
		t.Parallel()
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		c, err := NewDB(db)
		if err != nil {
			t.Fatal(err)
		}
		freeze(c)
		t.Cleanup(func() { _ = c.Close() })
		testRenewBatch(t, c, "database/sql")
	})
}

func testRenewBatch(t *testing.T, c *Client, prefix string) {
	ctx := testContext(t)
	var ls []*Lease
	for _, name := range []string{`plain`, `quote" back\slash`, `{brace,comma} NULL`, `gone`} {
		l, err := c.TryAcquire(ctx, prefix+"/"+name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	gone := ls[len(ls)-1]
	if _, err := c.q.Exec(ctx, "DELETE FROM pgfence.leases WHERE name = $1", gone.Name()); err != nil {
		t.Fatal(err)
	}
	before := make([]time.Time, len(ls))
	rs := make([]renewal, len(ls))
	for i, l := range ls {
		before[i], rs[i] = l.ExpiresAt(), renewal{l, l.TTL()}
	}
	var buf renewBuf
	for _, batch := range [][]renewal{rs, rs[:1]} {
		if again := c.renewBatchBuf(ctx, batch, lostRenewRejected, &buf); again {
			t.Fatal("renewal failed or found a lease busy")
		}
		for _, s := range append(buf.names[:cap(buf.names)], buf.owners[:cap(buf.owners)]...) {
			if s != "" {
				t.Fatalf("%q left in the buffers after the batch", s)
			}
		}
	}
	for i, l := range ls {
		switch {
		case l == gone:
			if !errors.Is(l.Err(), ErrLost) {
				t.Errorf("%s: %v, want ErrLost", l.Name(), l.Err())
			}
		case l.Err() != nil || !l.ExpiresAt().After(before[i]):
			t.Errorf("%s: %v, expires at %s, before the renewal %s", l.Name(), l.Err(), l.ExpiresAt(), before[i])
		}
	}
}
