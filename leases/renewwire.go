package leases

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgfence/pgfence/internal/dbx"
)

// A batched renewal sends four arrays with an element per due lease. pgx
// encodes a statement's arguments into a buffer that it drops after the
// statement once past 256 bytes, so every renewal of 10,000 leases re-grew
// it, a quarter at a time, through 3.5 MB of fresh memory: most of what
// keeping many leases alive cost (docs/performance.md, "10,000 held
// leases"). Over pgx the keepalive therefore encodes the arrays itself,
// into a buffer it keeps, and sends the statement on the connection's
// pgconn as an unnamed statement with binary arguments and results (as
// pgx's exec mode sends it), reporting it to the connection's QueryTracer
// as Query does. Over the simple protocol (chosen for poolers that need
// it) and over database/sql the statement goes through Query.

// renewRows runs the batched renewal of buf's arrays and appends a result
// per row to buf.results, matched to its lease by name.
func (c *Client) renewRows(ctx context.Context, buf *renewBuf) error {
	if c.pool == nil {
		return renewQuery(ctx, c.direct, buf)
	}
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	cfg := conn.Conn().Config() // a copy: read once
	if cfg.DefaultQueryExecMode == pgx.QueryExecModeSimpleProtocol {
		return renewQuery(ctx, conn, buf)
	}
	return renewWire(ctx, conn.Conn(), cfg.Tracer, buf)
}

// renewQuery is renewRows through Query.
func renewQuery(ctx context.Context, q dbx.Querier, buf *renewBuf) error {
	rows, err := q.Query(ctx, sqlRenewBatch, buf.args()...)
	if err != nil {
		return err
	}
	defer rows.Close()
	m := rowMatcher{names: buf.names}
	var name rowName
	var r renewResult
	dest := []any{&name, &r.expiresAt, &r.busy, &r.handover} // for every row: no allocation per row
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		r.i = m.index(len(buf.results), name)
		buf.results = append(buf.results, r)
	}
	if err := rows.Err(); err != nil {
		return dbError("renew", err)
	}
	return nil
}

// The OIDs of renew_batch's arguments and of its result's columns.
var (
	renewParamOIDs  = []uint32{pgtype.TextArrayOID, pgtype.TextArrayOID, pgtype.Int8ArrayOID, pgtype.Int8ArrayOID}
	renewResultOIDs = []uint32{pgtype.TextOID, pgtype.TimestamptzOID, pgtype.BoolOID, pgtype.BoolOID}
	binaryFormats   = []int16{pgtype.BinaryFormatCode, pgtype.BinaryFormatCode, pgtype.BinaryFormatCode, pgtype.BinaryFormatCode}
)

// renewWire is renewRows on conn's pgconn, with the arguments encoded
// into buf.wire; t, if not nil, is conn's tracer.
func renewWire(ctx context.Context, conn *pgx.Conn, t pgx.QueryTracer, buf *renewBuf) (err error) {
	w := buf.wire[:0]
	var ends [4]int
	w = appendTextArray(w, buf.names)
	ends[0] = len(w)
	w = appendTextArray(w, buf.owners)
	ends[1] = len(w)
	w = appendInt8Array(w, buf.fences)
	ends[2] = len(w)
	w = appendInt8Array(w, buf.ttls)
	ends[3] = len(w)
	buf.wire = w
	params := [][]byte{w[:ends[0]], w[ends[0]:ends[1]], w[ends[1]:ends[2]], w[ends[2]:ends[3]]}

	var tag pgconn.CommandTag
	if t != nil {
		ctx = t.TraceQueryStart(ctx, conn, pgx.TraceQueryStartData{
			SQL:  sqlRenewBatch,
			Args: buf.args(),
		})
		defer func() { t.TraceQueryEnd(ctx, conn, pgx.TraceQueryEndData{CommandTag: tag, Err: err}) }()
	}

	rr := conn.PgConn().ExecParams(ctx, sqlRenewBatch, params, renewParamOIDs, binaryFormats, binaryFormats)
	if err := checkRenewColumns(rr.FieldDescriptions()); err != nil {
		rr.Close()
		return err
	}
	m := rowMatcher{names: buf.names}
	var expiresAt pgtype.Timestamptz // for every row: no allocation per row
	scanTime := conn.TypeMap().PlanScan(pgtype.TimestamptzOID, pgtype.BinaryFormatCode, &expiresAt)
	for rr.NextRow() {
		v := rr.Values()
		if v[0] == nil {
			rr.Close()
			return errors.New("cannot scan NULL into a lease name")
		}
		expiresAt = pgtype.Timestamptz{}
		if v[1] != nil {
			if err := scanTime.Scan(v[1], &expiresAt); err != nil {
				rr.Close()
				return fmt.Errorf("expires_at: %w", err)
			}
		}
		r := renewResult{i: m.index(len(buf.results), v[0]), expiresAt: expiresAt}
		if r.busy, err = wireBool(v[2]); err != nil {
			rr.Close()
			return fmt.Errorf("busy: %w", err)
		}
		if r.handover, err = wireBool(v[3]); err != nil {
			rr.Close()
			return fmt.Errorf("handover: %w", err)
		}
		buf.results = append(buf.results, r)
	}
	if tag, err = rr.Close(); err != nil {
		return dbError("renew", err)
	}
	return nil
}

// checkRenewColumns fails unless fds are renew_batch's result columns, so
// that a schema returning something else is an error, not misread bytes.
// No columns: the statement failed, and Close reports why.
func checkRenewColumns(fds []pgconn.FieldDescription) error {
	if len(fds) == 0 {
		return nil
	}
	if len(fds) != len(renewResultOIDs) {
		return fmt.Errorf("renew_batch returned %d columns, want %d", len(fds), len(renewResultOIDs))
	}
	for i, fd := range fds {
		if fd.DataTypeOID != renewResultOIDs[i] || fd.Format != pgtype.BinaryFormatCode {
			return fmt.Errorf("renew_batch column %d (%s) has type %d in format %d, want type %d in binary",
				i+1, fd.Name, fd.DataTypeOID, fd.Format, renewResultOIDs[i])
		}
	}
	return nil
}

// wireBool decodes a bool in binary format; NULL is an error.
func wireBool(b []byte) (bool, error) {
	if len(b) != 1 {
		if b == nil {
			return false, errors.New("cannot scan NULL into bool")
		}
		return false, fmt.Errorf("invalid length for bool: %d", len(b))
	}
	return b[0] != 0, nil
}

// appendTextArray appends the binary form of a one-dimensional text[]
// without NULLs (array_recv's input).
func appendTextArray(w []byte, a []string) []byte {
	w = appendArrayHeader(w, pgtype.TextOID, len(a))
	for _, s := range a {
		w = binary.BigEndian.AppendUint32(w, uint32(len(s)))
		w = append(w, s...)
	}
	return w
}

// appendInt8Array appends the binary form of a one-dimensional bigint[]
// without NULLs.
func appendInt8Array(w []byte, a []int64) []byte {
	w = appendArrayHeader(w, pgtype.Int8OID, len(a))
	for _, n := range a {
		w = binary.BigEndian.AppendUint32(w, 8)
		w = binary.BigEndian.AppendUint64(w, uint64(n))
	}
	return w
}

// appendArrayHeader appends the header of a one-dimensional array of n
// elements of type elem, lower bound 1, no NULLs (as pgx writes it, also
// when n is 0).
func appendArrayHeader(w []byte, elem uint32, n int) []byte {
	w = binary.BigEndian.AppendUint32(w, 1) // dimensions
	w = binary.BigEndian.AppendUint32(w, 0) // no NULLs
	w = binary.BigEndian.AppendUint32(w, elem)
	w = binary.BigEndian.AppendUint32(w, uint32(n))
	return binary.BigEndian.AppendUint32(w, 1) // lower bound
}
