package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/dbx"
	"github.com/pgfence/pgfence/internal/pgerr"
)

// A grant is a write. If its caller gives up while the statement runs,
// closing the connection — what pgx and database/sql do when a context
// ends — loses the statement's answer, not the statement: the server can
// still commit the grant (its commit waiting for a synchronous standby,
// its reply in flight), and the lease is then held until its TTL by an
// owner nobody knows, so that nobody can release it. So a grant runs
// without its context's cancellation, and when the context ends the
// client sends a cancel request and waits for the answer: an error (the
// grant was cancelled, or failed: nothing is held) or the grant (it
// committed first: the caller gets the lease). If no answer comes within
// the release timeout (the server unreachable), the statement is made to
// fail on the client: the outcome is then unknown (errInDoubt), and a grant
// that committed expires after its TTL. A connection to which a cancel
// request was sent is closed, never reused: the request may arrive late
// and cancel the next statement.

// errInDoubt: the server did not answer a grant whose caller gave up.
var errInDoubt = errors.New("grant in doubt: no answer from the server after the cancellation; if the grant committed, it is held until it expires")

// queryGrant runs query, a grant, on a connection of its own and scans its
// one row into dest, settling the statement if ctx ends first (see above).
func (c *Client) queryGrant(ctx context.Context, query string, args []any, dest ...any) error {
	return c.serially(ctx, func() error { return c.queryGrantOnce(ctx, query, args, dest) })
}

func (c *Client) queryGrantOnce(ctx context.Context, query string, args []any, dest []any) error {
	if ctx.Done() == nil { // it never ends: nothing to settle
		return c.direct.QueryRow(ctx, query, args...).Scan(dest...)
	}
	if c.pool != nil {
		return c.queryGrantPgx(ctx, query, args, dest)
	}
	return c.queryGrantDB(ctx, query, args, dest)
}

func (c *Client) queryGrantPgx(ctx context.Context, query string, args []any, dest []any) error {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	pg := conn.Conn().PgConn()
	cancelRequest := pg.CancelRequest
	if c.hooks.cancelRequest != nil {
		cancelRequest = c.hooks.cancelRequest
	}
	// fail closes the socket: a read deadline would leave pgx draining
	// it in the background for up to 15s, past the caller's return.
	cancelled, answered, running, err := c.settle(ctx, cancelRequest, func() { _ = pg.Conn().Close() },
		func() error { return conn.QueryRow(context.WithoutCancel(ctx), query, args...).Scan(dest...) })
	switch {
	case !cancelled:
		conn.Release()
		return err
	case running != nil:
		c.lingering.Go(func() { <-running; dbx.Destroy(conn) })
	default:
		dbx.Destroy(conn)
	}
	return settled(answered, err)
}

func (c *Client) queryGrantDB(ctx context.Context, query string, args []any, dest []any) error {
	sc, err := c.sdb.Conn(ctx)
	if err != nil {
		return err
	}
	// pgx's stdlib driver gives its connection, whose cancel request
	// needs no more than the session's key (pgx sends it concurrently
	// with a running statement itself).
	var cancelRequest func(context.Context) error
	_ = sc.Raw(func(dc any) error {
		if p, ok := dc.(interface{ Conn() *pgx.Conn }); ok {
			cancelRequest = p.Conn().PgConn().CancelRequest
		}
		return nil
	})
	stmtCtx, cancelStmt := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStmt()
	cancelled, answered, running, err := c.settle(ctx, cancelRequest, cancelStmt,
		func() error { return dbx.SQL(sc).QueryRow(stmtCtx, query, args...).Scan(dest...) })
	switch {
	case !cancelled:
		_ = sc.Close()
		return err
	case running != nil:
		c.lingering.Go(func() { <-running; dbx.Discard(sc) })
	default:
		dbx.Discard(sc)
	}
	return settled(answered, err)
}

// endUnread ends the grant of name (a semaphore's slot when slot) that
// owner may hold after its grant statement failed with err while ctx
// lasted and without an error of the server's: the answer was lost on the
// way, or could not be read — pgx's text modes (exec, simple protocol)
// cannot read the timestamps of a session whose DateStyle is not ISO. The
// server may have committed the grant all the same, and nobody would know
// its owner: it would stay held until its TTL. Best effort, bounded by
// the release timeout.
func (c *Client) endUnread(ctx context.Context, name, owner string, slot bool, err error) {
	if err == nil || ctx.Err() != nil || errors.Is(err, errNoRows) || dbx.SQLState(err) != "" || pgconn.SafeToRetry(err) {
		return // nothing answered, nothing sent, or the server's own error
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.releaseTimeout)
	defer cancel()
	var n int64
	if rerr := c.q.QueryRow(rctx, sqlEndUnread, name, owner, slot).Scan(&n); rerr != nil {
		c.log.Warn("leases: could not end a grant whose answer was not read; it is held until it expires", "name", name, "owner", owner, "err", err, "end_err", rerr)
		return
	}
	if n > 0 {
		c.log.Warn("leases: ended a grant whose answer could not be read", "name", name, "owner", owner, "err", err)
	}
}

// settled is the outcome of a grant's statement that ctx ended while it
// ran: err, if the server answered it — a row, or an error of the
// server's (the cancel request's, most often) — else errInDoubt: fail
// cut it short, or the connection broke before the answer came.
func settled(answered bool, err error) error {
	if !answered || err != nil && pgerr.Code(err) == "" && !errors.Is(err, errNoRows) {
		return errInDoubt
	}
	return err
}

// otherDriverWait is how long a grant whose caller gave up waits for its
// statement to end by itself over a database/sql driver other than pgx's,
// which offers no cancel request of its own: long enough for a statement
// that was running normally, short beside a caller's deadline. Then the
// statement's context is cancelled: the driver sends its cancel request
// (lib/pq) or closes the connection, and the outcome is unknown.
const otherDriverWait = 250 * time.Millisecond

// cancelAgain is how long after a cancel request settle sends it again if
// the statement has not answered (doubling, up to a second).
const cancelAgain = 100 * time.Millisecond

// settle runs stmt, a grant's statement, under ctx. If ctx ends before
// stmt returns, it sends the cancel request, again while stmt has not
// returned, and waits for stmt, up to the release timeout (not at all if
// the request could not be sent) — or, with no cancel request to send
// (nil), waits otherDriverWait — then calls fail, which should make stmt
// return at once, and waits for it at most dbx.FailWait: a driver that
// does not end a statement when told to (lib/pq on a silent network sends
// a cancel request and keeps reading) is not waited for.
// cancelled says that ctx ended while stmt ran (the connection must then
// not be reused); answered, that stmt returned before fail; running, when
// not nil, that stmt still runs: it is closed when stmt returns, and the
// connection must not be touched before (nor stmt's destinations read).
func (c *Client) settle(ctx context.Context, cancelRequest func(context.Context) error, fail func(), stmt func() error) (cancelled, answered bool, running <-chan struct{}, err error) {
	finished := make(chan struct{})
	var stmtErr error
	go func() {
		stmtErr = stmt()
		close(finished)
	}()
	select {
	case <-finished:
		return false, true, nil, stmtErr
	case <-ctx.Done():
		select {
		case <-finished: // both at once: it was not cancelled
			return false, true, nil, stmtErr
		default:
		}
	}
	wait := c.cfg.releaseTimeout
	if cancelRequest == nil {
		wait = min(wait, otherDriverWait)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), wait)
	defer wcancel()
	if cancelRequest != nil && cancelRequest(wctx) != nil {
		// Not delivered (the server, or the way to it, is down): no
		// answer will come that the statement has not given yet.
		wcancel()
	}
	// A backend ignores a cancel request that arrives while it is idle,
	// and the statement may still have been on its way: the request is
	// sent again until the statement answers.
	again := time.NewTimer(cancelAgain)
	defer again.Stop()
	for pause := cancelAgain; wctx.Err() == nil; {
		select {
		case <-finished:
			return true, true, nil, stmtErr
		case <-again.C:
			if cancelRequest != nil && cancelRequest(wctx) != nil {
				wcancel()
			}
			pause = min(2*pause, time.Second)
			again.Reset(pause)
		case <-wctx.Done():
		}
	}
	select {
	case <-finished: // it answered just now
		return true, true, nil, stmtErr
	default:
	}
	fail()
	t := time.NewTimer(dbx.FailWait)
	defer t.Stop()
	select {
	case <-finished:
		return true, false, nil, stmtErr
	case <-t.C:
		return true, false, finished, errInDoubt
	}
}

// gaveUp is the error of grant op, by owner, whose statement ended with
// err after its context ended: the context's, and whether the outcome is
// unknown, which is also logged.
func (c *Client) gaveUp(ctx context.Context, op, owner string, err error) error {
	if errors.Is(err, errInDoubt) {
		c.log.Warn("leases: a cancelled grant is in doubt; if it committed, it is held until it expires", "op", op, "owner", owner)
		return fmt.Errorf("leases: %s: %w: %w", op, context.Cause(ctx), errInDoubt)
	}
	return fmt.Errorf("leases: %s: %w", op, context.Cause(ctx))
}
