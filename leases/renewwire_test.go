package leases

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The keepalive's own encoding of the renewal's arrays is byte for byte
// what pgx sends for them in binary.
func TestWireArraysMatchPgx(t *testing.T) {
	m := pgtype.NewMap()
	for _, a := range [][]string{nil, {""}, {"a"}, {"held/00001", `quote" back\slash`, "{brace,comma} NULL", "ü∂🔒", strings.Repeat("x", 300)}} {
		want, err := m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, textArray(a), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendTextArray([]byte("prefix"), a); !bytes.Equal(got[len("prefix"):], want) {
			t.Errorf("text[] %q:\n got % x\nwant % x", a, got[len("prefix"):], want)
		}
	}
	for _, a := range [][]int64{nil, {0}, {1, -1, math.MaxInt64, math.MinInt64, 3_000_000}} {
		want, err := m.Encode(pgtype.Int8ArrayOID, pgtype.BinaryFormatCode, int8Array(a), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendInt8Array(nil, a); !bytes.Equal(got, want) {
			t.Errorf("bigint[] %v:\n got % x\nwant % x", a, got, want)
		}
	}
}

// A result of another shape than renew_batch's is an error, not misread.
func TestCheckRenewColumns(t *testing.T) {
	col := func(oid uint32, format int16) pgconn.FieldDescription {
		return pgconn.FieldDescription{Name: "c", DataTypeOID: oid, Format: format}
	}
	b := int16(pgtype.BinaryFormatCode)
	good := []pgconn.FieldDescription{col(pgtype.TextOID, b), col(pgtype.TimestamptzOID, b), col(pgtype.BoolOID, b), col(pgtype.BoolOID, b)}
	if err := checkRenewColumns(good); err != nil {
		t.Errorf("renew_batch's columns: %v", err)
	}
	if err := checkRenewColumns(nil); err != nil {
		t.Errorf("no columns (a failed statement): %v", err)
	}
	for name, fds := range map[string][]pgconn.FieldDescription{
		"three columns": good[:3],
		"timestamp":     {good[0], col(pgtype.TimestampOID, b), good[2], good[3]},
		"text format":   {col(pgtype.TextOID, pgtype.TextFormatCode), good[1], good[2], good[3]},
	} {
		if err := checkRenewColumns(fds); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	for _, b := range [][]byte{nil, {}, {1, 0}} {
		if _, err := wireBool(b); err == nil {
			t.Errorf("bool % x: no error", b)
		}
	}
}

// queryLog is a pgx QueryTracer that records the statements a pool sends
// and how each ended.
type queryLog struct {
	mu   sync.Mutex
	sent []tracedQuery
}

type tracedQuery struct {
	sql   string
	nargs int
	tag   string
	err   error
}

type queryLogKey struct{}

func (q *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, queryLogKey{}, tracedQuery{sql: d.SQL, nargs: len(d.Args)})
}

func (q *queryLog) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	tq, _ := ctx.Value(queryLogKey{}).(tracedQuery)
	tq.tag, tq.err = d.CommandTag.String(), d.Err
	q.mu.Lock()
	q.sent = append(q.sent, tq)
	q.mu.Unlock()
}

func (q *queryLog) renewals() []tracedQuery {
	q.mu.Lock()
	defer q.mu.Unlock()
	var rs []tracedQuery
	for _, tq := range q.sent {
		if tq.sql == sqlRenewBatch {
			rs = append(rs, tq)
		}
	}
	return rs
}

// The keepalive's renewal, sent past pgx's Query, still reaches the
// pool's QueryTracer: once, with its arguments, its command tag and, when
// it fails, its error.
func TestRenewWireTraced(t *testing.T) {
	t.Parallel()
	log := &queryLog{}
	pool := pgtest.PoolFor(t, pgtest.URL(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = log })
	c := freeze(newClient(t, pool))
	ctx := testContext(t)
	var rs []renewal
	for _, name := range []string{"traced/a", "traced/b"} {
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, renewal{l, time.Minute})
	}
	if again := c.renewBatch(ctx, rs, lostRenewRejected); again {
		t.Fatal("renewal failed or found a lease busy")
	}
	got := log.renewals()
	if len(got) != 1 || got[0].nargs != 4 || got[0].tag != "SELECT 2" || got[0].err != nil {
		t.Fatalf("traced renewals %+v, want one with 4 arguments, tag SELECT 2, no error", got)
	}

	// A name PostgreSQL refuses (text cannot hold NUL) fails the
	// statement in the server, after pgx would have traced its start.
	bad := renewal{&Lease{c: c, name: "bad\x00name", owner: "o", fence: 1}, time.Minute}
	if again := c.renewBatch(ctx, append(rs, bad), lostRenewRejected); !again {
		t.Fatal("a renewal with a NUL in a name succeeded")
	}
	for _, r := range rs {
		if err := r.l.Err(); err != nil {
			t.Fatalf("a failed renewal lost %s: %v", r.l.Name(), err)
		}
	}
	got = log.renewals()
	var pgErr *pgconn.PgError
	if len(got) != 2 || !errors.As(got[1].err, &pgErr) || pgErr.Code != "22021" {
		t.Fatalf("traced renewals %+v, want a second one failed with 22021 (invalid byte sequence)", got)
	}
}
