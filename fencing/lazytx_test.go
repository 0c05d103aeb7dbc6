package fencing_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/dbx"
)

// syncCounter is a net.Conn that counts the frontend messages after which
// the server answers ReadyForQuery — Sync ('S') and Query ('Q') — that is,
// the round trips the client asks for. It counts only once armed (after
// the startup, whose first message has no type byte).
type syncCounter struct {
	net.Conn
	armed  atomic.Bool
	syncs  atomic.Int64
	header []byte // the bytes of a message header read so far
	skip   int    // the bytes of the current message's body still to pass
}

func (c *syncCounter) Write(b []byte) (int, error) {
	if c.armed.Load() {
		for p := b; len(p) > 0; {
			if c.skip > 0 {
				n := min(c.skip, len(p))
				c.skip, p = c.skip-n, p[n:]
				continue
			}
			n := min(5-len(c.header), len(p))
			c.header, p = append(c.header, p[:n]...), p[n:]
			if len(c.header) == 5 {
				if t := c.header[0]; t == 'S' || t == 'Q' {
					c.syncs.Add(1)
				}
				c.skip = int(binary.BigEndian.Uint32(c.header[1:])) - 4
				c.header = c.header[:0]
			}
		}
	}
	return c.Conn.Write(b)
}

// countingConn returns a connection to pool's database whose round trips
// the returned counter counts.
func countingConn(t *testing.T, pool *pgxpool.Pool) (*pgx.Conn, *syncCounter) {
	t.Helper()
	cfg := pool.Config().ConnConfig.Copy()
	var counter *syncCounter
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		counter = &syncCounter{Conn: c}
		return counter, nil
	}
	conn, err := pgx.ConnectConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(bg) })
	if counter == nil {
		t.Fatal("the connection was not dialled through DialFunc")
	}
	counter.armed.Store(true)
	return conn, counter
}

// TestInTxRoundTrips: a fenced transaction of one statement takes as many
// round trips as the statement and COMMIT alone — BEGIN, the declaration
// and the statement share the first — once the connection has prepared
// them (the first transaction prepares in one more).
func TestInTxRoundTrips(t *testing.T) {
	pool := setup(t)
	tok := grant(t, pool, "roundtrips", time.Hour)
	conn, counter := countingConn(t, pool)
	var fence int64
	writes := []struct {
		by    string
		write func() error
	}{
		{"Exec", func() error { return write(conn, tok, 1, "v") }},
		{"QueryRow", func() (err error) { fence, err = writeRow(conn, tok, 1, "w"); return err }},
	}
	for _, w := range writes {
		for i := range 3 {
			before := counter.syncs.Load()
			if err := w.write(); err != nil {
				t.Fatalf("%s %d: %v", w.by, i, err)
			}
			n := counter.syncs.Load() - before
			t.Logf("fenced transaction %d by %s: %d round trips", i, w.by, n)
			if i > 0 && n != 2 {
				t.Errorf("fenced transaction %d by %s took %d round trips, want 2 (the statement with BEGIN and the declaration, then COMMIT)", i, w.by, n)
			}
		}
	}
	wantItem(t, pool, 1, "w", tok.Fence)
	if fence != tok.Fence {
		t.Errorf("QueryRow scanned fence %d, want %d", fence, tok.Fence)
	}
}

// writeRow is write by QueryRow: it updates row id to v in InTx with tok
// and returns the fence the guard stamped on it.
func writeRow(db fencing.DB, tok fencing.Token, id int, v string) (fence int64, err error) {
	err = fencing.InTx(bg, db, tok, func(tx pgx.Tx) error {
		return tx.QueryRow(bg, `UPDATE items SET v = $2 WHERE id = $1 RETURNING fence`, id, v).Scan(&fence)
	})
	return fence, err
}

// TestInTxFirstCall: whatever fn calls first — the Exec that rides with
// BEGIN or any other method, which begins first — its statements run in
// one transaction that declares the token: the guarded write that follows
// is stamped with the token's fence, and the call's own result is right.
func TestInTxFirstCall(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "firstcall", time.Hour)
	var xid int64
	calls := []struct {
		name string
		call func(tx pgx.Tx) error
	}{
		{"Exec with arguments", func(tx pgx.Tx) error {
			tag, err := tx.Exec(bg, `UPDATE items SET v = $1 WHERE id = -1`, "none")
			if err == nil && tag.String() != "UPDATE 0" {
				err = fmt.Errorf("command tag %q, want UPDATE 0", tag)
			}
			return err
		}},
		{"Exec without arguments", func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, `SELECT 1; SELECT 2`) // the simple protocol: two statements
			return err
		}},
		{"Exec by the simple protocol", func(tx pgx.Tx) error {
			_, err := tx.Exec(bg, `SELECT $1::int`, pgx.QueryExecModeSimpleProtocol, 1)
			return err
		}},
		{"QueryRow with result formats", func(tx pgx.Tx) error {
			var n int32
			return tx.QueryRow(bg, `SELECT $1::int`, pgx.QueryResultFormats{pgx.TextFormatCode}, 7).Scan(&n)
		}},
		{"Query", func(tx pgx.Tx) error {
			rows, err := tx.Query(bg, `SELECT pg_current_xact_id()::text::bigint`)
			if err != nil {
				return err
			}
			xids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err == nil && len(xids) == 1 {
				xid = xids[0]
			}
			return err
		}},
		{"QueryRow", func(tx pgx.Tx) error {
			return tx.QueryRow(bg, `SELECT pg_current_xact_id()::text::bigint`).Scan(&xid)
		}},
		{"SendBatch", func(tx pgx.Tx) error {
			var b pgx.Batch
			b.Queue(`SELECT 1`)
			return tx.SendBatch(bg, &b).Close()
		}},
		{"CopyFrom", func(tx pgx.Tx) error {
			_, err := tx.CopyFrom(bg, pgx.Identifier{"items"}, []string{"id", "v"}, pgx.CopyFromRows([][]any{{1000, "copied"}}))
			return err
		}},
		{"Prepare", func(tx pgx.Tx) error {
			_, err := tx.Prepare(bg, "firstcall", `SELECT $1::int`)
			return err
		}},
		{"Begin", func(tx pgx.Tx) error {
			sp, err := tx.Begin(bg)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(bg, upsertItem, 1001, "savepoint"); err != nil {
				return err
			}
			return sp.Commit(bg)
		}},
		{"LargeObjects", func(tx pgx.Tx) error {
			lo := tx.LargeObjects()
			_, err := lo.Create(bg, 0)
			return err
		}},
		{"Conn", func(tx pgx.Tx) error {
			_, err := tx.Conn().Exec(bg, upsertItem, 1002, "conn")
			return err
		}},
	}
	for i, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			id := i + 1
			err := fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
				if err := c.call(tx); err != nil {
					return fmt.Errorf("the first call: %w", err)
				}
				_, err := tx.Exec(bg, upsertItem, id, c.name)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			wantItem(t, pool, id, c.name, tok.Fence)
		})
	}
	for id, v := range map[int]string{1000: "copied", 1001: "savepoint", 1002: "conn"} {
		wantItem(t, pool, id, v, tok.Fence)
	}
	if xid == 0 {
		t.Error("Query and QueryRow read no transaction id")
	}
}

// TestInTxWithoutCalls: an fn that makes no call sends nothing — no
// transaction, no declaration — and InTx returns what fn returns.
func TestInTxWithoutCalls(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "nocalls", time.Hour)
	conn, counter := countingConn(t, pool)
	before := counter.syncs.Load()
	if err := fencing.InTx(bg, conn, tok, func(pgx.Tx) error { return nil }); err != nil {
		t.Fatalf("InTx with an fn that does nothing: %v", err)
	}
	errFn := errors.New("fn's own error")
	if err := fencing.InTx(bg, conn, tok, func(pgx.Tx) error { return errFn }); err != errFn {
		t.Fatalf("InTx = %v, want fn's error unchanged", err)
	}
	if n := counter.syncs.Load() - before; n != 0 {
		t.Fatalf("InTx with fns that make no call took %d round trips, want 0", n)
	}
	if s := conn.PgConn().TxStatus(); s != 'I' {
		t.Fatalf("transaction status %q after InTx, want idle", s)
	}
}

// TestInTxTxAfterReturn: a transaction fn keeps after InTx returned is
// closed — every call fails with pgx.ErrTxClosed and sends nothing — even
// if fn never used it, so that it cannot begin a transaction on a
// connection given back to the pool.
func TestInTxTxAfterReturn(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "after", time.Hour)
	conn, counter := countingConn(t, pool)
	for _, use := range []bool{false, true} {
		var kept pgx.Tx
		if err := fencing.InTx(bg, conn, tok, func(tx pgx.Tx) error {
			kept = tx
			if use {
				_, err := tx.Exec(bg, upsertItem, 1, "used")
				return err
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		before := counter.syncs.Load()
		if _, err := kept.Exec(bg, upsertItem, 2, "late"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("Exec after InTx (used %v) = %v, want ErrTxClosed", use, err)
		}
		if err := kept.QueryRow(bg, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("QueryRow after InTx (used %v) = %v, want ErrTxClosed", use, err)
		}
		if err := kept.Commit(bg); !errors.Is(err, pgx.ErrTxClosed) {
			t.Errorf("Commit after InTx (used %v) = %v, want ErrTxClosed", use, err)
		}
		if n := counter.syncs.Load() - before; n != 0 {
			t.Errorf("calls after InTx (used %v) took %d round trips, want 0", use, n)
		}
	}
	if _, _, ok := item(t, pool, 2); ok {
		t.Fatal("a write after InTx returned landed")
	}
}

// TestInTxFirstStatementFails: a first statement the server fails — here
// at its preparation, a missing table — returns its error, not a failure to
// begin, and aborts the transaction, as after any failed statement. One
// with an argument pgx cannot encode returns pgx's error, and, as pgx then
// closes the connection under the batch, InTx returns it even if fn drops
// it: nothing commits.
func TestInTxFirstStatementFails(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	tok := grant(t, pool, "fails", time.Hour)
	err := fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, `UPDATE missing SET v = $1`, "x")
		wantCode(t, err, "42P01")
		if strings.Contains(err.Error(), "begin") {
			t.Errorf("the statement's error %q says begin", err)
		}
		_, err = tx.Exec(bg, upsertItem, 1, "after the failure")
		wantCode(t, err, "25P02") // in failed transaction
		return nil
	})
	if !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("InTx after an ignored failure = %v, want ErrTxCommitRollback", err)
	}
	err = fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		return tx.QueryRow(bg, `SELECT v FROM missing WHERE id = $1`, 1).Scan(new(string))
	})
	wantCode(t, err, "42P01")
	if strings.Contains(err.Error(), "begin") {
		t.Errorf("QueryRow's error %q says begin", err)
	}

	err = fencing.InTx(bg, pool, tok, func(tx pgx.Tx) error {
		_, err := tx.Exec(bg, upsertItem, 2, make(chan int))
		if err == nil || dbx.PgError(err) != nil || strings.Contains(err.Error(), "begin") {
			t.Errorf("Exec with an argument pgx cannot encode = %v, want pgx's error", err)
		}
		_, _ = tx.Exec(bg, upsertItem, 3, "after the encoding error")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "encode") {
		t.Fatalf("InTx after an ignored encoding error = %v, want pgx's error", err)
	}
	for id := 1; id <= 3; id++ {
		if _, _, ok := item(t, pool, id); ok {
			t.Fatalf("item %d written by a transaction whose statement failed", id)
		}
	}
	if err := write(pool, tok, 4, "the pool goes on"); err != nil {
		t.Fatal(err)
	}
}

// TestInTxStaleFirstStatement: a stale token's first statement, riding
// with BEGIN, is rejected by the guard and maps to ErrStale, by Exec and
// by QueryRow alike.
func TestInTxStaleFirstStatement(t *testing.T) {
	t.Parallel()
	pool := setup(t)
	old := grant(t, pool, "stalefirst", time.Hour)
	expire(t, pool, "stalefirst")
	tok := grant(t, pool, "stalefirst", time.Hour)
	if err := write(pool, tok, 1, "current"); err != nil {
		t.Fatal(err)
	}
	wantStaleTx(t, write(pool, old, 1, "stale by Exec"), old)
	_, err := writeRow(pool, old, 1, "stale by QueryRow")
	wantStaleTx(t, err, old)
	wantItem(t, pool, 1, "current", tok.Fence)
}

// statementLog is a pgx tracer that records the statements it is told of,
// as a query (QueryTracer) or as a batch's (BatchTracer).
type statementLog struct {
	mu             sync.Mutex
	queries, batch []string
}

func (l *statementLog) add(to *[]string, sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	*to = append(*to, sql)
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(&l.queries, d.SQL)
	return ctx
}
func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(&l.batch, d.SQL)
}
func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestInTxTracer: a pgx tracer on the pool is told of every statement of
// fn, as InTx's documentation says: the first, which rides with BEGIN, as
// a batch's (BatchTracer), the others as queries (QueryTracer).
func TestInTxTracer(t *testing.T) {
	pool := setup(t)
	tok := grant(t, pool, "tracer", time.Hour)
	log := new(statementLog)
	cfg := pool.Config().Copy()
	cfg.ConnConfig.Tracer = log
	traced, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close()
	const second = `UPDATE items SET v = v || '!' WHERE id = $1`
	err = fencing.InTx(bg, traced, tok, func(tx pgx.Tx) error {
		if _, err := tx.Exec(bg, upsertItem, 1, "v"); err != nil {
			return err
		}
		_, err := tx.Exec(bg, second, 1)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	wantItem(t, pool, 1, "v!", tok.Fence)
	log.mu.Lock()
	defer log.mu.Unlock()
	t.Logf("as queries: %q; in a batch: %q", log.queries, log.batch)
	if !slices.Contains(log.batch, upsertItem) || slices.Contains(log.queries, upsertItem) {
		t.Errorf("fn's first statement: told as a batch's %v, as a query %v; want as a batch's only",
			slices.Contains(log.batch, upsertItem), slices.Contains(log.queries, upsertItem))
	}
	if !slices.Contains(log.queries, second) {
		t.Errorf("fn's second statement was not told as a query: %q", log.queries)
	}
}
