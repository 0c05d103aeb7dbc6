package integration_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/leases"
	"github.com/pgfence/pgfence/migrations"
	"github.com/pgfence/pgfence/pglock"
)

// hostileCase is one bad call: it must fail with an error that matches want
// (errors.Is) when the package has a sentinel for it, and whose message
// names the offending setting (mention) when it has none — the point is
// that the caller can tell what was wrong.
type hostileCase struct {
	name    string
	call    func(ctx context.Context) error
	want    error  // nil: no sentinel exists for this input
	mention string // "": any error will do (e.g. the server's own)
}

// TestHostileInput feeds every public entry point bad names, TTLs, tokens,
// options, contexts and DSNs. It proves guarantee 6: each gets a clear
// error, and nothing is written (pgfence.leases stays empty, the protected
// table too, no advisory lock is held) or leaked (no acquired connection,
// no goroutine: goleak runs after the package's tests).
func TestHostileInput(t *testing.T) {
	t.Parallel()
	u := setup(t)
	pool := newPool(t, u, "hostile")
	protectedTable(t, pool, "resource", "id int PRIMARY KEY")
	client, err := leases.New(pool, leases.WithOwner("hostile"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	locker := newLocker(t, pool)

	unreachable := closedPortURL(t)
	deadPool := newPool(t, unreachable, "dead")
	deadClient, err := leases.New(deadPool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deadClient.Close() })

	ran := false // set by any callback that must never run
	fn := func(context.Context, *pglock.Lock) error { ran = true; return nil }
	leaseFn := func(context.Context, *leases.Lease) error { ran = true; return nil }
	inTx := func(ctx context.Context, f func(tx pgx.Tx) error) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return fmt.Errorf("test setup: %w", err)
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		return f(tx)
	}

	var cases []hostileCase
	add := func(name string, want error, mention string, call func(ctx context.Context) error) {
		cases = append(cases, hostileCase{name: name, call: call, want: want, mention: mention})
	}

	badNames := []struct{ label, name string }{
		{"empty", ""},
		{"201 bytes", strings.Repeat("n", 201)},
		{"NUL", "a\x00b"},
		{"invalid UTF-8", "\xff\xfe"},
	}
	for _, bn := range badNames {
		n := bn.name
		tag := " name " + bn.label
		add("pglock.Lock"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error { _, err := locker.Lock(ctx, n); return err })
		add("pglock.TryLock"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error { _, err := locker.TryLock(ctx, n); return err })
		add("pglock.RLock"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error { _, err := locker.RLock(ctx, n); return err })
		add("pglock.TryRLock"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error { _, err := locker.TryRLock(ctx, n); return err })
		add("pglock.Do"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error { return locker.Do(ctx, n, fn) })
		add("pglock.XactLock"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error { return pglock.XactLock(ctx, tx, n) })
		})
		add("pglock.TryXactLock"+tag, pglock.ErrInvalid, "", func(ctx context.Context) error {
			return inTx(ctx, func(tx pgx.Tx) error { _, err := pglock.TryXactLock(ctx, tx, n); return err })
		})
		// leases exports no sentinel for bad input: the message must name
		// the setting.
		add("leases.Acquire"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { _, err := client.Acquire(ctx, n, time.Second); return err })
		add("leases.TryAcquire"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { _, err := client.TryAcquire(ctx, n, time.Second); return err })
		add("leases.Run"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { return client.Run(ctx, n, time.Second, leaseFn) })
		add("leases.Lead"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { return client.Lead(ctx, n, time.Second, leaseFn) })
		add("leases.Observe"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { _, err := client.Observe(ctx, n); return err })
		add("leases.Get"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { _, err := client.Get(ctx, n); return err })
		add("leases.ForceRelease"+tag, leases.ErrInvalid, "name", func(ctx context.Context) error { return client.ForceRelease(ctx, n) })
		// As a table name: refused before anything is sent.
		add("fencing.Protect"+tag, fencing.ErrInvalid, "", func(ctx context.Context) error { return fencing.Protect(ctx, pool, n) })
		// As a token's lease: only a name a lease can have is declared
		// (and then rejected by the guard: no such grant).
		var wantTok error = fencing.ErrInvalid
		if n != "" && len(n) <= 200 && utf8.ValidString(n) && !strings.ContainsRune(n, 0) {
			wantTok = nil
		}
		add("fencing.InTx lease"+tag, wantTok, "", func(ctx context.Context) error {
			return fencing.InTx(ctx, pool, fencing.Token{Lease: n, Fence: 1}, writeRow)
		})
	}

	for _, ttl := range []time.Duration{0, -time.Second, 999 * time.Millisecond} {
		tag := fmt.Sprintf(" ttl %v", ttl)
		add("leases.Acquire"+tag, leases.ErrInvalid, "ttl", func(ctx context.Context) error { _, err := client.Acquire(ctx, "ok", ttl); return err })
		add("leases.TryAcquire"+tag, leases.ErrInvalid, "ttl", func(ctx context.Context) error { _, err := client.TryAcquire(ctx, "ok", ttl); return err })
		add("leases.Run"+tag, leases.ErrInvalid, "ttl", func(ctx context.Context) error { return client.Run(ctx, "ok", ttl, leaseFn) })
		add("leases.Lead"+tag, leases.ErrInvalid, "ttl", func(ctx context.Context) error { return client.Lead(ctx, "ok", ttl, leaseFn) })
	}

	for _, fence := range []int64{0, -1} {
		tok := fencing.Token{Lease: "ok", Fence: fence}
		add(fmt.Sprintf("fencing.InTx fence %d", fence), fencing.ErrInvalid, "", func(ctx context.Context) error { return fencing.InTx(ctx, pool, tok, writeRow) })
		add(fmt.Sprintf("fencing.Begin fence %d", fence), fencing.ErrInvalid, "", func(ctx context.Context) error {
			tx, err := fencing.Begin(ctx, pool, tok)
			if tx != nil {
				_ = tx.Rollback(ctx)
			}
			return err
		})
	}
	add("fencing.InTx nil fn", nil, "fn", func(ctx context.Context) error {
		return fencing.InTx(ctx, pool, fencing.Token{Lease: "ok", Fence: 1}, nil)
	})
	add("fencing.Begin nil db", nil, "db", func(ctx context.Context) error {
		_, err := fencing.Begin(ctx, nil, fencing.Token{Lease: "ok", Fence: 1})
		return err
	})
	add("fencing.Protect nil db", nil, "db", func(ctx context.Context) error { return fencing.Protect(ctx, nil, "resource") })
	add("fencing.Protect missing table", nil, "", func(ctx context.Context) error { return fencing.Protect(ctx, pool, "no_such_table") })

	// Options.
	add("leases.New owner empty", leases.ErrInvalid, "owner", func(context.Context) error { return newClientErr(pool, leases.WithOwner("")) })
	add("leases.New owner 101 bytes", leases.ErrInvalid, "owner", func(context.Context) error { return newClientErr(pool, leases.WithOwner(strings.Repeat("o", 101))) })
	add("leases.New owner NUL", leases.ErrInvalid, "owner", func(context.Context) error { return newClientErr(pool, leases.WithOwner("a\x00b")) })
	add("leases.New logger nil", leases.ErrInvalid, "logger", func(context.Context) error { return newClientErr(pool, leases.WithLogger(nil)) })
	add("leases.New pool nil", leases.ErrInvalid, "pool", func(context.Context) error { return newClientErr(nil) })
	add("pglock.New pool nil", pglock.ErrInvalid, "pool", func(context.Context) error { _, err := pglock.New(nil); return err })
	add("pglock.New liveness 0", pglock.ErrInvalid, "interval", func(context.Context) error {
		_, err := pglock.New(pool, pglock.WithLivenessCheck(0, time.Second))
		return err
	})
	add("pglock.New logger nil", pglock.ErrInvalid, "logger", func(context.Context) error {
		_, err := pglock.New(pool, pglock.WithLogger(nil))
		return err
	})
	add("pglock.Do nil fn", pglock.ErrInvalid, "fn", func(ctx context.Context) error { return locker.Do(ctx, "ok", nil) })
	add("leases.Run nil fn", leases.ErrInvalid, "fn", func(ctx context.Context) error { return client.Run(ctx, "ok", time.Second, nil) })

	// Cancelled contexts.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	add("pglock.Lock cancelled", context.Canceled, "", func(context.Context) error { _, err := locker.Lock(cancelled, "ok"); return err })
	add("leases.Acquire cancelled", context.Canceled, "", func(context.Context) error { _, err := client.Acquire(cancelled, "ok", time.Second); return err })
	add("leases.TryAcquire cancelled", context.Canceled, "", func(context.Context) error { _, err := client.TryAcquire(cancelled, "ok", time.Second); return err })
	add("fencing.InTx cancelled", context.Canceled, "", func(context.Context) error {
		return fencing.InTx(cancelled, pool, fencing.Token{Lease: "ok", Fence: 1}, writeRow)
	})

	// DSNs: malformed, and a closed loopback port.
	for _, dsn := range []struct{ label, dsn string }{
		{"malformed URL", "postgres://%zz"},
		{"malformed keywords", "host=127.0.0.1 port=notaport"},
		{"unreachable", unreachable},
	} {
		add("migrations.Up "+dsn.label, nil, "", func(ctx context.Context) error { return migrations.Up(ctx, dsn.dsn) })
		add("migrations.Down "+dsn.label, nil, "", func(ctx context.Context) error { return migrations.Down(ctx, dsn.dsn) })
		add("migrations.Version "+dsn.label, nil, "", func(ctx context.Context) error { _, _, err := migrations.Version(ctx, dsn.dsn); return err })
	}
	deadLocker := newLocker(t, deadPool)
	add("pglock.Lock unreachable", nil, "", func(ctx context.Context) error { _, err := deadLocker.Lock(ctx, "ok"); return err })
	add("pglock.TryLock unreachable", nil, "", func(ctx context.Context) error { _, err := deadLocker.TryLock(ctx, "ok"); return err })
	add("leases.Acquire unreachable", nil, "", func(ctx context.Context) error { _, err := deadClient.Acquire(ctx, "ok", time.Second); return err })
	add("leases.TryAcquire unreachable", nil, "", func(ctx context.Context) error { _, err := deadClient.TryAcquire(ctx, "ok", time.Second); return err })
	add("leases.Get unreachable", nil, "", func(ctx context.Context) error { _, err := deadClient.Get(ctx, "ok"); return err })
	add("fencing.InTx unreachable", nil, "", func(ctx context.Context) error {
		return fencing.InTx(ctx, deadPool, fencing.Token{Lease: "ok", Fence: 1}, writeRow)
	})
	add("fencing.Protect unreachable", nil, "", func(ctx context.Context) error { return fencing.Protect(ctx, deadPool, "resource") })

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// Every case fails fast; 15s only bounds a call that would hang.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			start := time.Now()
			err := c.call(ctx)
			switch {
			case err == nil:
				t.Fatalf("no error")
			case c.want != nil && !errors.Is(err, c.want):
				t.Errorf("error %q does not match %v", err, c.want)
			case c.mention != "" && !strings.Contains(strings.ToLower(err.Error()), c.mention):
				t.Errorf("error %q does not name the setting %q", err, c.mention)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v to fail", d)
			}
			if ran {
				t.Errorf("the callback ran")
				ran = false
			}
		})
	}

	// Nothing written, nothing held, nothing acquired.
	ctx := ctxT(t, 30*time.Second)
	var nLeases, nRows, nLocks int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgfence.leases), (SELECT count(*) FROM resource)`).Scan(&nLeases, &nRows); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, sqlCountAdvisoryLocks).Scan(&nLocks); err != nil {
		t.Fatal(err)
	}
	if nLeases != 0 || nRows != 0 || nLocks != 0 {
		t.Errorf("bad input wrote something: %d leases, %d protected rows, %d advisory locks", nLeases, nRows, nLocks)
	}
	for _, p := range []struct {
		name string
		n    int32
	}{{"pool", pool.Stat().AcquiredConns()}, {"unreachable pool", deadPool.Stat().AcquiredConns()}} {
		if p.n != 0 {
			t.Errorf("%s: %d connections still acquired after the bad calls", p.name, p.n)
		}
	}
	t.Logf("%d bad calls, each refused", len(cases))
}

// writeRow writes row 1 of resource: it must never get that far.
func writeRow(tx pgx.Tx) error {
	_, err := tx.Exec(context.Background(), "INSERT INTO resource (id) VALUES (1)")
	return err
}

// newClientErr returns leases.New's error, closing a client it should not
// have made.
func newClientErr(pool *pgxpool.Pool, opts ...leases.Option) error {
	c, err := leases.New(pool, opts...)
	if c != nil {
		_ = c.Close()
	}
	return err
}

// closedPortURL is a database URL on a loopback port where nothing listens.
func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=5"
}
