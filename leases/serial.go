package leases

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// The Client's statements are single-statement transactions written for
// READ COMMITTED. A role or database whose default_transaction_isolation
// is repeatable read or serializable makes them fail with SQLSTATE 40001
// whenever replicas contend for a row ("could not serialize access"); a
// deadlock (40P01) ends one of two statements the same way. Either rolls
// the statement's transaction back whole, so running it again is safe and
// is what PostgreSQL asks of its caller: the Client does, for a bounded
// time, backing off with jitter, and logs once that it had to.

// serialRetryFor bounds the time one statement is retried for, from its
// first failure (a count of attempts would not do: on a loaded server, 20
// attempts of three contending clients all failed in tests); serialBackoff
// is the most the first retry waits, doubling up to serialMaxBackoff.
const (
	serialRetryFor   = 10 * time.Second
	serialBackoff    = time.Millisecond
	serialMaxBackoff = 64 * time.Millisecond
)

// retryable reports whether err rolled its statement's transaction back
// for a reason that running it again can clear. Any driver's error: lib/pq
// through database/sql as well as pgx.
func retryable(err error) bool {
	switch dbx.SQLState(err) {
	case pgerr.SerializationFailure, pgerr.DeadlockDetected:
		return true
	}
	return false
}

// serially runs f until it returns nil or an error that is not retryable,
// for at most serialRetryFor after its first failure, while ctx lasts; it
// returns f's last error.
func (c *Client) serially(ctx context.Context, f func() error) error {
	err := f()
	if err == nil || !retryable(err) {
		return err
	}
	until := time.Now().Add(serialRetryFor)
	for attempt := 1; err != nil && retryable(err) && time.Now().Before(until); attempt++ {
		c.serialOnce.Do(func() {
			c.log.Warn("leases: retrying a statement after a serialization failure; is default_transaction_isolation read committed?",
				"sqlstate", dbx.SQLState(err))
		})
		backoff := min(serialBackoff<<min(attempt-1, 16), serialMaxBackoff)
		t := time.NewTimer(rand.N(backoff) + 1)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		err = f()
	}
	return err
}

// serialQuerier is q running each statement serially (above). Only the
// errors Query and Exec return, and those QueryRow's Scan returns, are
// retried: a multi-row result's later errors reach its reader.
type serialQuerier struct {
	q dbx.Querier
	c *Client
}

func (s serialQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return serialRow{s: s, ctx: ctx, sql: sql, args: args}
}

func (s serialQuerier) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	var rows pgx.Rows
	err := s.c.serially(ctx, func() (err error) {
		rows, err = s.q.Query(ctx, sql, args...)
		return err
	})
	return rows, err
}

func (s serialQuerier) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := s.c.serially(ctx, func() (err error) {
		tag, err = s.q.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// serialRow sends its statement when scanned, as often as serially runs
// it.
type serialRow struct {
	s    serialQuerier
	ctx  context.Context
	sql  string
	args []any
}

func (r serialRow) Scan(dest ...any) error {
	return r.s.c.serially(r.ctx, func() error { return r.s.q.QueryRow(r.ctx, r.sql, r.args...).Scan(dest...) })
}
