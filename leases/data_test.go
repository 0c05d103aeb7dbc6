package leases

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Data attached at the grant is read back by Get, List, HeldError and
// Observe; SetData replaces it and observers see the new value at once
// (a notification, not the 10s poll).
func TestDataReadEverywhere(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2, WithPollInterval(10*time.Second))
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	l, err := a.TryAcquire(ctx, "leader", time.Minute, WithData(json.RawMessage(`{ "addr" : "10.0.0.1:8080" }`)))
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"addr": "10.0.0.1:8080"}` // jsonb's text form
	if got := string(l.Data()); got != `{"addr":"10.0.0.1:8080"}` {
		t.Errorf("Lease.Data = %s, want the compact value", got)
	}
	info, err := b.Get(ctx, "leader")
	if err != nil || string(info.Data) != want {
		t.Errorf("Get: %s, %v; want %s", info.Data, err, want)
	}
	infos, err := b.List(ctx)
	if err != nil || len(infos) != 1 || string(infos[0].Data) != want {
		t.Errorf("List: %+v, %v; want one lease with data %s", infos, err, want)
	}
	var held *HeldError
	if _, err := b.TryAcquire(ctx, "leader", time.Minute); !errors.As(err, &held) || string(held.Holder.Data) != want {
		t.Errorf("TryAcquire of a held lease: %v; want a HeldError carrying the holder's data", err)
	}

	ch, err := b.Observe(ctx, "leader")
	if err != nil {
		t.Fatal(err)
	}
	if first := <-ch; string(first.Data) != want {
		t.Errorf("Observe first value: %s, want %s", first.Data, want)
	}
	waitListening(t, b)
	begin := time.Now()
	if err := l.SetData(ctx, json.RawMessage(`{"addr":"10.0.0.2:8080"}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case info := <-ch:
		if string(info.Data) != `{"addr": "10.0.0.2:8080"}` || info.Fence != l.Fence() {
			t.Errorf("observed %+v, want the new data under fence %d", info, l.Fence())
		}
		if took := time.Since(begin); took > 5*time.Second {
			t.Errorf("observer saw the new data after %s, want far below the 10s poll", took)
		}
	case <-ctx.Done():
		t.Fatal("observer never saw the new data")
	}
	if err := l.SetData(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if info, err := a.Get(ctx, "leader"); err != nil || info.Data != nil || l.Data() != nil {
		t.Errorf("after SetData(nil): Get %s, %v, Lease.Data %s; want no data", info.Data, err, l.Data())
	}

	// The next grant starts without the old grant's data.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.SetData(ctx, json.RawMessage(`1`)); !errors.Is(err, ErrReleased) {
		t.Errorf("SetData after Release: %v, want ErrReleased", err)
	}
	l2, err := b.TryAcquire(ctx, "leader", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := a.Get(ctx, "leader"); err != nil || info.Data != nil || l2.Data() != nil {
		t.Errorf("next grant: data %s, %v; want none", info.Data, err)
	}
}

// Oversize or malformed data is refused with ErrInvalid and nothing is
// written — by the client, and by PostgreSQL for SQL callers.
func TestDataBoundsWriteNothing(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	big := json.RawMessage(`"` + strings.Repeat("x", MaxDataLen-1) + `"`) // MaxDataLen+1 bytes
	for _, d := range []json.RawMessage{big, json.RawMessage(`{"a":`), json.RawMessage(``)} {
		if _, err := c.TryAcquire(ctx, "bounded", time.Minute, WithData(d)); !errors.Is(err, ErrInvalid) {
			t.Errorf("TryAcquire with data of %d bytes: %v, want ErrInvalid", len(d), err)
		}
	}
	if err := c.Run(ctx, "bounded", time.Minute, func(context.Context, *Lease) error { return nil }, WithData(big)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Run with oversize data: %v, want ErrInvalid", err)
	}
	if !strings.Contains(func() string { _, err := c.TryAcquire(ctx, "bounded", time.Minute, WithData(big)); return err.Error() }(), "at most 1024 bytes") {
		t.Error("the oversize error does not name the bound")
	}
	if _, err := c.Get(ctx, "bounded"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after refused grants: Get %v, want ErrNotHeld (nothing written)", err)
	}
	fits := json.RawMessage(`"` + strings.Repeat("x", MaxDataLen-2) + `"`)
	l, err := c.TryAcquire(ctx, "bounded", time.Minute, WithData(fits))
	if err != nil {
		t.Fatalf("data of exactly MaxDataLen bytes: %v", err)
	}
	if err := l.SetData(ctx, big); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetData oversize: %v, want ErrInvalid", err)
	}
	// PostgreSQL's own bound, as an SQL caller meets it.
	_, err = pool.Exec(ctx, `SELECT pgfence.set_data($1, $2, $3, $4)`, l.Name(), l.Owner(), l.Fence(), string(big))
	if code := sqlstate(err); code != "22023" {
		t.Errorf("set_data oversize in SQL: %v, want SQLSTATE 22023", err)
	}
	_, err = pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('other', 'me', 60000000, $1)`, string(big))
	if code := sqlstate(err); code != "22023" {
		t.Errorf("try_acquire oversize in SQL: %v, want SQLSTATE 22023", err)
	}
	if info, err := c.Get(ctx, "bounded"); err != nil || len(info.Data) != MaxDataLen || l.Err() != nil {
		t.Errorf("after refused updates: %d bytes of data, %v, lease %v; want the old value, still held", len(info.Data), err, l.Err())
	}
	if _, err := c.Get(ctx, "other"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after a refused SQL grant: Get %v, want ErrNotHeld", err)
	}
}

func sqlstate(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// A data update races a takeover and is rejected, whichever way the race
// goes. Live holder: an operator's transaction force-releases the lease
// and grants it to b; the holder's update, issued meanwhile, waits for that
// transaction's row lock, re-checks the new row version when it commits,
// and writes nothing. Holder paused past its TTL (its context not yet
// cancelled): the expired grant no longer matches, committed takeover or
// not. Either way: ErrLost, the lease is lost, b's data stands.
func TestSetDataRacingTakeover(t *testing.T) {
	t.Parallel()
	for _, paused := range []bool{false, true} {
		c, pool := setup(t)
		freeze(c)
		ctx := testContext(t)
		ttl := time.Minute
		if paused {
			ttl = MinTTL
		}
		l, err := c.TryAcquire(ctx, "race", ttl, WithData(json.RawMessage(`"a"`)))
		if err != nil {
			t.Fatal(err)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if paused {
			pause(c, l)
			waitExpired(t, pool, "race")
		} else if _, err := tx.Exec(ctx, `SELECT pgfence.force_release('race')`); err != nil {
			t.Fatal(err)
		}
		var fence int64
		if err := tx.QueryRow(ctx, `SELECT fence FROM pgfence.try_acquire('race', 'b', 60000000, '"b"') WHERE granted`).Scan(&fence); err != nil {
			t.Fatalf("takeover: %v", err)
		}
		done := make(chan error, 1)
		go func() { done <- l.SetData(ctx, json.RawMessage(`"a2"`)) }()
		if paused {
			if err := <-done; !errors.Is(err, ErrLost) {
				t.Errorf("paused holder: SetData during an uncommitted takeover: %v, want ErrLost", err)
			}
		} else {
			waitLockWait(t, pool, "set_data")
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if !paused {
			if err := <-done; !errors.Is(err, ErrLost) {
				t.Errorf("live holder: SetData racing a takeover: %v, want ErrLost", err)
			}
		}
		if !errors.Is(l.Err(), ErrLost) {
			t.Errorf("paused %v: lease after the rejected update: %v, want lost", paused, l.Err())
		}
		info, err := c.Get(ctx, "race")
		if err != nil || string(info.Data) != `"b"` || info.Fence != fence || fence <= l.Fence() {
			t.Errorf("paused %v: after the race: %+v, %v; want b's data under fence %d > %d", paused, info, err, fence, l.Fence())
		}
	}
}

// pause simulates a holder paused past its TTL: its local deadline never
// comes, so its context stays alive while the grant expires.
func pause(c *Client, l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setDeadlineLocked(l, time.Now().Add(time.Hour))
}

// waitExpired waits until the named lease's grant has expired by the
// database clock.
func waitExpired(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	waitFor(t, pool, `SELECT NOT EXISTS (SELECT FROM pgfence.leases WHERE name = $1 AND expires_at > clock_timestamp())`, name)
}

// waitLockWait waits until a backend in pool's database running a
// statement containing text waits for a lock.
func waitLockWait(t *testing.T, pool *pgxpool.Pool, text string) {
	t.Helper()
	waitFor(t, pool, `SELECT EXISTS (SELECT FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'
		  AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid())`, text)
}

// waitFor polls query (one boolean, argument arg) until it is true.
func waitFor(t *testing.T, pool *pgxpool.Pool, query string, arg any) {
	t.Helper()
	ctx := testContext(t)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		var ok bool
		if err := pool.QueryRow(ctx, query, arg).Scan(&ok); err != nil {
			t.Fatalf("wait: %v", err)
		}
		if ok {
			return
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("wait: condition never held: %s", query)
		}
	}
}

// JSON that encoding/json accepts but jsonb cannot store — a \u0000
// escape, bytes that are not UTF-8, a lone surrogate escape — is bad input
// like malformed JSON: ErrInvalid before anything is sent, not a database
// error that Lead would retry for ever. Escapes jsonb does store (a
// surrogate pair, an escaped backslash before "u0000") still pass.
func TestDataJSONBCannotStoreIsInvalid(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	ctx := testContext(t)
	bad := []json.RawMessage{
		json.RawMessage(`"\u0000"`),
		json.RawMessage(`{"a\u0000b":1}`),
		json.RawMessage("\"\xff\""),
		json.RawMessage(`"\ud800"`),
		json.RawMessage(`"\udc00"`),
		json.RawMessage(`["\ud800\u0041"]`),
		// Numbers beyond PostgreSQL's numeric (22003).
		json.RawMessage(`1e131072`),
		json.RawMessage(`{"n":-1e999999}`),
		json.RawMessage(`[1e-16384]`),
	}
	for _, d := range bad {
		if _, err := c.TryAcquire(ctx, "jsonb", time.Minute, WithData(d)); !errors.Is(err, ErrInvalid) {
			t.Errorf("TryAcquire with data %q: %v, want ErrInvalid", d, err)
		}
	}
	if _, err := c.Get(ctx, "jsonb"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("after refused grants: Get %v, want ErrNotHeld (nothing written)", err)
	}
	// Lead validates its options once: bad data must end it at once, not
	// campaign until ctx ends (5s: far above one failed statement, far
	// below the test's bound).
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Lead(lctx, "jsonb", time.Minute, func(context.Context, *Lease) error { return nil },
		WithData(bad[0])); !errors.Is(err, ErrInvalid) {
		t.Errorf("Lead with data %q: %v, want ErrInvalid", bad[0], err)
	}

	good := json.RawMessage(`{"smile":"\ud83d\ude00","literal":"\\u0000"}`)
	l, err := c.TryAcquire(ctx, "jsonb", time.Minute, WithData(good))
	if err != nil {
		t.Fatalf("TryAcquire with data jsonb stores: %v", err)
	}
	for _, d := range bad {
		if err := l.SetData(ctx, d); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetData %q: %v, want ErrInvalid", d, err)
		}
	}
	info, err := c.Get(ctx, "jsonb")
	if err != nil || !strings.Contains(string(info.Data), `"\\u0000"`) || l.Err() != nil {
		t.Errorf("after refused updates: data %s, %v, lease %v; want the first value, still held", info.Data, err, l.Err())
	}
}

// numericFits agrees with the server about the numbers jsonb can store,
// at the edges of numeric's range: where it says a number fits, the
// server stores it; where it says not, the server refuses it.
func TestNumericFitsAgreesWithServer(t *testing.T) {
	t.Parallel()
	_, pool := setup(t)
	ctx := testContext(t)
	for _, num := range []string{
		"0", "-0", "1", "-12.5e3", "1e131071", "1e131072", "9.9e131071", "99e131070", "99e131071", "0.001e131074",
		"1E+0131071", "1e-16383", "1e-16384", "0e-16383", "0e-16384", "0.5e-16382", "0.5e-16383", "12e-16384",
		"0e999999", "0.0e131072", "0e1073741822", "0e1073741823", "0e-1073741823", "1e99999999999", "0e0000000000001",
	} {
		var stored bool
		err := pool.QueryRow(ctx, `SELECT $1::jsonb IS NOT NULL`, num).Scan(&stored)
		if err != nil && !strings.Contains(err.Error(), "22003") {
			t.Fatalf("%s: %v", num, err)
		}
		// PostgreSQL 15 refuses a zero with the exponent 2^30-1, and 17
		// stores it: numericFits keeps 15's bound, refusing what a
		// supported server refuses.
		stricter := num == "0e1073741823"
		if fits := numericFits(num); fits != (err == nil) && (fits || !stricter) {
			t.Errorf("numericFits(%s) = %v, but the server says %v", num, fits, err)
		}
	}
}

// heldSetData is a pgx tracer that holds SetData's statement at its start
// until proceed is closed, having said so on started.
type heldSetData struct{ started, proceed chan struct{} }

func (h heldSetData) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == sqlSetData {
		close(h.started)
		<-h.proceed
	}
	return ctx
}

func (heldSetData) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// SetData racing the holder's own Release (another goroutine of the
// holder ends the work): the release commits first and the update finds
// no live grant. The lease was released, not lost: SetData returns Err()
// (ErrReleased), as Renew does, not an ErrLost that would raise a false
// alarm about exclusivity.
func TestSetDataRacingOwnRelease(t *testing.T) {
	t.Parallel()
	h := heldSetData{started: make(chan struct{}), proceed: make(chan struct{})}
	pool := pgtest.PoolFor(t, pgtest.URL(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = h })
	c := newClient(t, pool)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "racing", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.SetData(ctx, json.RawMessage(`"late"`)) }()
	select {
	case <-h.started: // past its check that the lease is held
	case <-ctx.Done():
		t.Fatal("SetData never sent its statement")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	close(h.proceed)
	if err := <-done; !errors.Is(err, ErrReleased) || errors.Is(err, ErrLost) {
		t.Errorf("SetData racing Release: %v, want ErrReleased", err)
	}
}

// setDataRunning counts the backends in admin's database that run SetData's
// statement and, if waitEvent is not empty, wait on that event.
func setDataRunning(t *testing.T, ctx context.Context, admin *pgxpool.Pool, waitEvent string) int {
	t.Helper()
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
  WHERE datname = current_database() AND state = 'active' AND query = $1
    AND ($2 = '' OR wait_event = $2)`, sqlSetData, waitEvent).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// SetData whose ctx ends while its commit waits for a synchronous standby
// (scenario: the standby is down): the commit is in doubt. PostgreSQL has
// written it locally and makes it visible once the wait ends, so the data
// is replaced although SetData returned an error and Data() still returns
// the old value — what SetData's documentation says. The next SetData
// makes the two agree again.
func TestSetDataCommitInDoubt(t *testing.T) {
	t.Parallel()
	url, admin, ctx := standbyDown(t)
	// One connection, whose commits are local until the test says otherwise.
	pool := pgtest.PoolFor(t, url+"&synchronous_commit=local", func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	c := newClient(t, pool)
	l, err := c.TryAcquire(ctx, "in-doubt", time.Minute, WithData(json.RawMessage(`"old"`)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SET synchronous_commit = on`); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.SetData(sctx, json.RawMessage(`"new"`)) }()
	pgtest.WaitFor(t, testTimeout, "SetData's commit to wait for the standby", func() bool {
		return setDataRunning(t, ctx, admin, "SyncRep") > 0
	})
	cancel()
	err = <-done
	if err == nil {
		t.Fatal("SetData whose commit waited for a standby that is down returned nil")
	}
	t.Logf("SetData cut short in its commit: %v", err)
	if got := string(l.Data()); got != `"old"` {
		t.Errorf("Data() after a failed SetData = %s, want the old value", got)
	}
	standbyBack(t, ctx, admin)
	pgtest.WaitFor(t, testTimeout, "SetData's statement to end", func() bool { return setDataRunning(t, ctx, admin, "") == 0 })
	var stored string
	if err := admin.QueryRow(ctx, `SELECT metadata::text FROM pgfence.leases WHERE name = 'in-doubt'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != `"new"` {
		t.Errorf("stored data %s after the commit wait ended, want the new value (the update committed locally)", stored)
	}
	if err := l.SetData(ctx, json.RawMessage(`"newer"`)); err != nil {
		t.Fatal(err)
	}
	info, err := c.Get(ctx, "in-doubt")
	if err != nil || string(info.Data) != `"newer"` || string(l.Data()) != `"newer"` {
		t.Errorf("after the next SetData: stored %s, %v; Data() %s; want both \"newer\"", info.Data, err, l.Data())
	}
}
