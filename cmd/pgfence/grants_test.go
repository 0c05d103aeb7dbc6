package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/leases"
)

// grantTo grants role (a pgfence role) to the login role name.
func grantTo(t *testing.T, dbURL, role, name string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `GRANT `+role+` TO `+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
}

// `GRANT pgfence_client TO app` is enough for everything an application
// does — leases, locks, fenced writes, listing — and pgfence_operator adds
// the break-glass; without them the role gets a clear error.
func TestLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	role, roleURL := pgtest.LoginRole(t, dbURL, "")
	opRole, opURL := pgtest.LoginRole(t, dbURL, "")

	// Without a pgfence role: a clear error, not a crash.
	if r := db(t, roleURL, "leases", "ls"); r.code != exitFailure || !strings.Contains(r.stderr, "permission denied") {
		t.Errorf("leases ls without grants: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := db(t, roleURL, "run", "--lease", "app/job", "--ttl", "2s", "--", "true"); r.code != exitFailure || !strings.Contains(r.stderr, "pgfence_client") {
		t.Errorf("run --lease without grants: exit %d, stderr %q; want 1 and the role to grant", r.code, r.stderr)
	}
	grantTo(t, dbURL, "pgfence_client", role)
	grantTo(t, dbURL, "pgfence_operator", opRole)

	admin, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	id := pgx.Identifier{role}.Sanitize()
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
	// write; the operator's force-release, and the stale write after it.
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
	if r := db(t, roleURL, "leases", "release", "--force", "app/invoices"); r.code != exitFailure || !strings.Contains(r.stderr, "permission denied") {
		t.Errorf("leases release --force as the application role: exit %d, stderr %q; want refused", r.code, r.stderr)
	}
	if r := db(t, opURL, "leases", "release", "--force", "app/invoices"); r.code != 0 {
		t.Errorf("leases release --force as the operator role: exit %d", r.code)
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
	if r := db(t, opURL, "check", "--max-hold", "1h"); r.code != 0 {
		t.Errorf("check as the operator role: exit %d", r.code)
	}
}
