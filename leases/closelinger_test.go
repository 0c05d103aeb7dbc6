package leases

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestCloseWaitsForStatementsLeftRunning (scenario: over database/sql, a
// statement's context ends and its driver does not end it — lib/pq sends a
// cancel request and keeps reading until the server answers, which under
// load or behind a slow network takes a while). The call returns at once
// and leaves the statement running on a connection of its own (dbx). Close
// returned meanwhile, with that connection still in use: CI saw
// TestLibpqReleaseWhoseAnswerIsLost find "1 connections in use" after
// Close, the keepalive's release cut short by the shutdown still running.
// Close now waits for such statements, within the release timeout. Here a
// driver holds each release statement until its context ends, and then
// until the test lets it go.
func TestCloseWaitsForStatementsLeftRunning(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	cfg, err := pgx.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	s := &stubborn{match: "pgfence.release($1", gate: make(chan struct{})}
	db := sql.OpenDB(stubbornConnector{stdlib.GetConnector(*cfg), s})
	t.Cleanup(func() { _ = db.Close() })
	c, err := NewDB(db, WithReleaseTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	let := sync.OnceFunc(func() { close(s.gate) })
	t.Cleanup(let)

	l, err := c.TryAcquire(ctx, "job", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := l.Release(rctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Release whose statement outlived its context = %v; want context.DeadlineExceeded", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a release statement still running, %d connections in use", err, db.Stats().InUse)
	case <-time.After(2 * time.Second):
		// Close's own statements take milliseconds; one that does not
		// wait returns well within this.
	}
	let()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not return once the statement it waited for ended")
	}
	if n := db.Stats().InUse; n != 0 {
		t.Errorf("after Close: %d connections in use", n)
	}
}

// stubborn holds a statement whose text holds match until its context
// ends, and then until gate closes, before running it: a driver that
// does not end a statement when its context ends, over a slow server.
type stubborn struct {
	match string
	gate  chan struct{}
}

type stubbornConnector struct {
	driver.Connector
	s *stubborn
}

func (c stubbornConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return stubbornConn{conn.(pgxDriverConn), c.s}, nil
}

// pgxDriverConn is what pgx's stdlib connection offers database/sql.
type pgxDriverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.QueryerContext
	driver.ExecerContext
	driver.NamedValueChecker
	driver.SessionResetter
	driver.Pinger
}

type stubbornConn struct {
	pgxDriverConn
	s *stubborn
}

func (c stubbornConn) hold(ctx context.Context, query string) {
	if strings.Contains(query, c.s.match) {
		<-ctx.Done()
		<-c.s.gate
	}
}

func (c stubbornConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.hold(ctx, query)
	return c.pgxDriverConn.QueryContext(context.WithoutCancel(ctx), query, args)
}

func (c stubbornConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.hold(ctx, query)
	return c.pgxDriverConn.ExecContext(context.WithoutCancel(ctx), query, args)
}
