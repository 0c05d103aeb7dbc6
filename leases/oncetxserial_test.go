package leases

import (
	"context"
	"errors"
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
// made to land in that window: as the record's batch (BEGIN, the
// declaration and the record, sent together) starts, a batch tracer takes
// the lease's fence lock from another session, so that the guard waits
// for it after the snapshot; the lease is renewed while it waits, then the
// lock is let go — once.
func TestOnceTxRecordAfterOwnRenewal(t *testing.T) {
	t.Parallel()
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			base := pgtest.URL(t)
			u := pgtest.WithSettings(base, "default_transaction_isolation="+strings.ReplaceAll(level, " ", `\ `))
			ctx := testContext(t)
			hold, err := pgx.Connect(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = hold.Close(context.Background()) })
			tr := &renewWhileRecordWaits{hold: hold}
			pool := pgtest.PoolFor(t, u, func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = tr })
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
			tr.wg.Wait()
			if err := tr.result(); err != nil {
				t.Fatalf("the tracer did not renew the lease while the record waited (the test tests nothing): %v", err)
			}
			if !ran || err != nil || runs != 1 {
				t.Errorf("OnceTx = (%v, %v), fn ran %d times; want (true, nil), once", ran, err, runs)
			}
			if n := tr.recordsSent(); n != 2 {
				t.Errorf("the record was sent %d times, want 2: refused after the renewal (40001), then again", n)
			}
		})
	}
}

// renewWhileRecordWaits, as the first batch holding pgfence.mark_done
// starts, takes the lease "job"'s fence lock on hold, then, in a goroutine,
// waits until a session waits for that lock (the record's guard, after
// its transaction's snapshot), renews the lease through the Client and
// lets the lock go.
type renewWhileRecordWaits struct {
	hold    *pgx.Conn
	wg      sync.WaitGroup
	mu      sync.Mutex
	c       *Client
	records int
	started bool
	err     error
}

func (r *renewWhileRecordWaits) set(c *Client) {
	r.mu.Lock()
	r.c = c
	r.mu.Unlock()
}

func (r *renewWhileRecordWaits) result() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.started {
		return errors.New("no batch held the record")
	}
	return r.err
}

func (r *renewWhileRecordWaits) recordsSent() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.records
}

func (r *renewWhileRecordWaits) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	record := false
	for _, q := range data.Batch.QueuedQueries {
		record = record || strings.Contains(q.SQL, "pgfence.mark_done")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !record || r.c == nil {
		return ctx
	}
	r.records++
	if r.started {
		return ctx
	}
	r.started = true
	ctx = context.WithoutCancel(ctx)
	if _, err := r.hold.Exec(ctx, `SELECT pg_advisory_lock(1885824614, hashtext('job'))`); err != nil {
		r.err = err
		return ctx
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := r.renewWhenWaited(ctx)
		if _, uerr := r.hold.Exec(ctx, `SELECT pg_advisory_unlock(1885824614, hashtext('job'))`); err == nil {
			err = uerr
		}
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
	}()
	return ctx
}

// renewWhenWaited renews the lease once another session of the database
// waits for the fence lock.
func (r *renewWhileRecordWaits) renewWhenWaited(ctx context.Context) error {
	var qerr error
	waited := pgtest.Poll(30*time.Second, func() bool { // a loaded machine
		var waiting bool
		qerr = r.hold.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database
			WHERE d.datname = current_database() AND l.locktype = 'advisory' AND l.classid = 1885824614 AND NOT l.granted)`).Scan(&waiting)
		return qerr != nil || waiting
	})
	switch {
	case qerr != nil:
		return qerr
	case !waited:
		return errors.New("no session waited for the fence lock within 30s")
	}
	r.mu.Lock()
	c := r.c
	r.mu.Unlock()
	c.mu.Lock()
	l := c.held["job"]
	c.mu.Unlock()
	if l == nil {
		return errNoRows
	}
	return l.Renew(ctx)
}

func (r *renewWhileRecordWaits) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
}
func (r *renewWhileRecordWaits) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (r *renewWhileRecordWaits) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (r *renewWhileRecordWaits) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
