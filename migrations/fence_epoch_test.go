package migrations_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// gap is how far pgfence.next_fence() advances fences on a new epoch.
const gap = int64(1) << 32

// appRole creates a login role with only what an application needs to take
// leases (USAGE on the schema, DML on pgfence.leases: no privilege on the
// sequence or the epoch table), dropped when t ends, and returns u rewritten
// to log in as it.
func appRole(t *testing.T, u string) string {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "pgfence_epoch_" + hex.EncodeToString(b)
	id := pgx.Identifier{name}.Sanitize()
	admin := connect(t, u)
	for _, q := range []string{
		`CREATE ROLE ` + id + ` LOGIN`,
		`GRANT USAGE ON SCHEMA pgfence TO ` + id,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON pgfence.leases TO ` + id,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Errorf("drop role %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		for _, q := range []string{`DROP OWNED BY ` + id, `DROP ROLE ` + id} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	ru, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	ru.User = url.User(name)
	return ru.String()
}

func sqlstateOf(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// TestNextFenceAdvancesOnceOnNewEpoch: when the recorded epoch is not the
// server's (as after a promotion, or a restore into another cluster),
// the first draws advance the sequence by the gap exactly once, however
// many sessions draw at the same moment, and record the server's epoch; an
// application role with no privilege on the sequence or the epoch table can
// draw, but cannot bump.
func TestNextFenceAdvancesOnceOnNewEpoch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	admin := connect(t, u)
	app := appRole(t, u)

	var first int64
	appConn := connect(t, app)
	if err := appConn.QueryRow(ctx, `SELECT pgfence.next_fence()`).Scan(&first); err != nil {
		t.Fatalf("next_fence as the application role: %v", err)
	}
	if first != 1 {
		t.Errorf("first fence of a new database = %d, want 1 (no advance on the epoch recorded at migration)", first)
	}

	for _, tc := range []struct{ name, simulate string }{
		{"new timeline", `UPDATE pgfence.fence_epoch SET timeline = timeline - 1`},
		{"another cluster", `UPDATE pgfence.fence_epoch SET system_identifier = system_identifier + 1`},
	} {
		var last int64
		if err := admin.QueryRow(ctx, `SELECT last_value FROM pgfence.fence_seq`).Scan(&last); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, tc.simulate); err != nil {
			t.Fatal(err)
		}
		const sessions = 8
		fences := make(chan int64, sessions)
		var wg sync.WaitGroup
		for range sessions {
			c := connect(t, app)
			wg.Go(func() {
				var f int64
				if err := c.QueryRow(ctx, `SELECT pgfence.next_fence()`).Scan(&f); err != nil {
					t.Errorf("%s: next_fence: %v", tc.name, err)
				}
				fences <- f
			})
		}
		wg.Wait()
		close(fences)
		for f := range fences {
			if f <= last+gap || f > last+gap+sessions {
				t.Errorf("%s: fence %d; want in (%d, %d]: one advance by the gap for all sessions", tc.name, f, last+gap, last+gap+sessions)
			}
		}
		var current bool
		if err := admin.QueryRow(ctx, `
SELECT e.system_identifier = s.system_identifier AND e.timeline = s.timeline
  FROM pgfence.fence_epoch AS e, pgfence.server_epoch() AS s`).Scan(&current); err != nil || !current {
			t.Errorf("%s: recorded epoch is the server's = %v, %v; want true", tc.name, current, err)
		}
	}

	var f int64
	err := appConn.QueryRow(ctx, `SELECT pgfence.bump_fence(10)`).Scan(&f)
	if sqlstateOf(err) != "42501" {
		t.Errorf("bump_fence as the application role = %d, %v; want SQLSTATE 42501", f, err)
	}
	var last, floor int64
	if err := admin.QueryRow(ctx, `SELECT last_value FROM pgfence.fence_seq`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	if err := admin.QueryRow(ctx, `SELECT pgfence.bump_fence(10)`).Scan(&floor); err != nil || floor != last+10 {
		t.Errorf("bump_fence(10) = %d, %v; want %d", floor, err, last+10)
	}
	if err := appConn.QueryRow(ctx, `SELECT pgfence.next_fence()`).Scan(&f); err != nil || f != floor+1 {
		t.Errorf("next_fence after bump_fence = %d, %v; want %d", f, err, floor+1)
	}
	for _, bad := range []string{`SELECT pgfence.bump_fence(0)`, `SELECT pgfence.bump_fence(-1)`, `SELECT pgfence.bump_fence(NULL)`} {
		if err := admin.QueryRow(ctx, bad).Scan(&f); sqlstateOf(err) != "22023" {
			t.Errorf("%s = %v; want SQLSTATE 22023", bad, err)
		}
	}
	if err := admin.QueryRow(ctx, `SELECT pgfence.bump_fence(9223372036854775807)`).Scan(&f); sqlstateOf(err) != "2200H" {
		t.Errorf("bump_fence past bigint = %v; want SQLSTATE 2200H", err)
	}
}
