package leases

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Under REPEATABLE READ or SERIALIZABLE (a role's or database's default),
// OnceTx's transaction takes its snapshot when it declares the token; if
// the lease's own renewal commits before the record (pgfence.mark_done)
// share-locks the lease row, the guard fails with a serialization failure
// (40001). Nothing has run yet and the transaction rolled back whole: the
// record must be tried again, as Once's is. Before, OnceTx returned
// "could not serialize access due to concurrent update" and the period
// went undone, for no fault of fn or the database. Here the renewal is
// made to land in that window: a query tracer renews the lease just
// before the record is sent, once.
func TestOnceTxRecordAfterOwnRenewal(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			base := pgtest.URL(t)
			u := pgtest.WithSettings(base, "default_transaction_isolation="+strings.ReplaceAll(level, " ", `\ `))
			tr := &renewBeforeRecord{}
			pool := pgtest.PoolFor(t, u, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr })
			ctx := testContext(t)
			var got string
			if err := pool.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&got); err != nil || got != level {
				t.Fatalf("transaction_isolation = %q (%v), want %q", got, err, level)
			}
			c := newClient(t, pool)
			tr.set(c)
			runs := 0
			ran, err := c.OnceTx(ctx, "job", "p", time.Minute, func(ctx context.Context, tx pgx.Tx, l *Lease) error {
				runs++
				return nil
			})
			if !tr.renewed() {
				t.Fatal("the tracer did not renew the lease before the record: the test tests nothing")
			}
			if !ran || err != nil || runs != 1 {
				t.Errorf("OnceTx = (%v, %v), fn ran %d times; want (true, nil), once", ran, err, runs)
			}
		})
	}
}

// renewBeforeRecord renews, through the Client, the lease that OnceTx
// holds right before its first pgfence.mark_done is sent: after the
// transaction's snapshot, before the record share-locks the row.
type renewBeforeRecord struct {
	mu   sync.Mutex
	c    *Client
	done bool
	err  error
}

func (r *renewBeforeRecord) set(c *Client) {
	r.mu.Lock()
	r.c = c
	r.mu.Unlock()
}

func (r *renewBeforeRecord) renewed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done && r.err == nil
}

func (r *renewBeforeRecord) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.Contains(data.SQL, "pgfence.mark_done") {
		return ctx
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done || r.c == nil {
		return ctx
	}
	r.done = true
	r.c.mu.Lock()
	l := r.c.held["job"]
	r.c.mu.Unlock()
	if l == nil {
		r.err = errNoRows
		return ctx
	}
	r.err = l.Renew(context.WithoutCancel(ctx))
	return ctx
}

func (r *renewBeforeRecord) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
