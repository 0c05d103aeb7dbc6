package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// appGrants are the privileges the README's operator's guide tells a
// least-privileged application role to have (%s = the role). Keep the two in
// step.
var appGrants = []string{
	`GRANT USAGE ON SCHEMA pgfence TO %s`,
	`GRANT SELECT, INSERT, UPDATE, DELETE ON pgfence.leases TO %s`,
	`GRANT EXECUTE ON FUNCTION pgfence.next_fence() TO %s`,
	`GRANT EXECUTE ON FUNCTION pgfence.lock_key(text) TO %s`,
}

// newRole creates a login role with a random name and password on url's
// server, dropped (with its privileges in url's database) when t ends, and
// returns url rewritten to log in as it.
func newRole(t *testing.T, dbURL string) (name, roleURL string) {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name = "pgfence_app_" + hex.EncodeToString(b)
	_, _ = rand.Read(b)
	password := hex.EncodeToString(b)
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	id := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE ROLE "+id+" LOGIN PASSWORD '"+password+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Errorf("drop role %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		for _, q := range []string{
			"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '" + name + "'",
			"DROP OWNED BY " + id,
			"DROP ROLE " + id,
		} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("this test needs a URL-form database URL: %v", err)
	}
	u.User = url.UserPassword(name, password)
	return name, u.String()
}

// The grants in the operator's guide are enough for everything an
// application does — leases, locks, fenced writes — and for the operator's
// listing and break-glass; without them the role gets a clear error.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	role, roleURL := newRole(t, dbURL)

	// Without grants: a clear error, not a crash.
	if r := db(t, roleURL, "leases", "ls"); r.code != exitFailure || !strings.Contains(r.stderr, "permission denied") {
		t.Errorf("leases ls without grants: exit %d, stderr %q", r.code, r.stderr)
	}

	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	id := pgx.Identifier{role}.Sanitize()
	for _, g := range appGrants {
		q := strings.Replace(g, "%s", id, 1)
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// The application's own protected table: owned by the migration role,
	// written by the application role.
	for _, q := range []string{
		`CREATE TABLE public.invoices (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`,
		`SELECT pgfence.protect('public.invoices')`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON public.invoices TO ` + id,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	if r := db(t, roleURL, "run", "--lease", "app/job", "--ttl", "2s", "--", "sh", "-c", `echo "$PGFENCE_FENCE"`); r.code != 0 {
		t.Errorf("run --lease as the application role: exit %d", r.code)
	}
	if r := db(t, roleURL, "run", "--lock", "app/job", "--", "true"); r.code != 0 {
		t.Errorf("run --lock as the application role: exit %d", r.code)
	}

	// The library, as the application role: a lease, its renewal, a fenced
	// write, an operator's force-release, and the stale write after it.
	pool := pgtest.PoolFor(t, roleURL)
	lc, err := leases.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	l, err := lc.Acquire(ctx, "app/invoices", 3*time.Second)
	if err != nil {
		t.Fatalf("acquire as the application role: %v", err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renew as the application role: %v", err)
	}
	if err := fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO public.invoices (id) VALUES (1)`)
		return err
	}); err != nil {
		t.Fatalf("fenced write as the application role: %v", err)
	}
	if r := db(t, roleURL, "leases", "ls"); r.code != 0 || !strings.Contains(r.stdout, "app/invoices") {
		t.Errorf("leases ls as the application role: exit %d", r.code)
	}
	if r := db(t, roleURL, "leases", "release", "--force", "app/invoices"); r.code != 0 {
		t.Errorf("leases release --force as the application role: exit %d", r.code)
	}
	err = fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE public.invoices SET id = 2 WHERE id = 1`)
		return err
	})
	if !fencing.IsStale(err) {
		t.Errorf("fenced write after force-release: %v, want stale", err)
	}
	if r := db(t, roleURL, "locks", "ls"); r.code != 0 {
		t.Errorf("locks ls as the application role: exit %d", r.code)
	}
}

// Each schema and table grant is needed: without it, taking a lease fails.
// (Fences come from pgfence.next_fence(), SECURITY DEFINER, so the role
// needs no privilege on pgfence.fence_seq.)
func TestLeastPrivilegeGrantsAreNeeded(t *testing.T) {
	t.Parallel()
	for skip := range 2 { // the functions' EXECUTE is PUBLIC by default
		on := appGrants[skip][strings.Index(appGrants[skip], " ON ")+4 : strings.Index(appGrants[skip], " TO ")]
		t.Run("without "+on, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dbURL := pgtest.URL(t)
			role, roleURL := newRole(t, dbURL)
			admin, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close(ctx)
			for i, g := range appGrants {
				if i == skip {
					continue
				}
				if _, err := admin.Exec(ctx, strings.Replace(g, "%s", pgx.Identifier{role}.Sanitize(), 1)); err != nil {
					t.Fatal(err)
				}
			}
			r := db(t, roleURL, "run", "--lease", "app/job", "--ttl", "2s", "--", "true")
			if r.code != exitFailure || !strings.Contains(r.stderr, "permission denied") {
				t.Errorf("without %q: run --lease exit %d, stderr %q; want 1, permission denied", appGrants[skip], r.code, r.stderr)
			}
		})
	}
}
