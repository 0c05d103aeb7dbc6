package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestClientRoleOnceAndSemaphores: with only pgfence_client, an
// application takes semaphore slots, records a period in a fenced
// transaction and releases with a minimum hold (migration 6); it cannot
// write pgfence.once directly.
func TestClientRoleOnceAndSemaphores(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	app := connect(t, loginRole(t, u, "pgfence_client"))
	ctx := context.Background()

	var slot int
	var lease string
	var fence int64
	if err := app.QueryRow(ctx, `SELECT slot, lease, fence FROM pgfence.try_acquire_slot('sem', 2, 'app', 60000000) WHERE granted`).Scan(&slot, &lease, &fence); err != nil {
		t.Fatalf("try_acquire_slot as pgfence_client: %v", err)
	}
	if slot != 1 || lease != "sem#1" {
		t.Fatalf("first slot = %d %q, want 1 \"sem#1\"", slot, lease)
	}
	var recorded bool
	err := pgx.BeginFunc(ctx, app, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pgfence.declare_token($1, $2)`, lease, fence); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pgfence.mark_done($1, '2026-12-01')`, lease).Scan(&recorded)
	})
	if err != nil || !recorded {
		t.Fatalf("mark_done as pgfence_client: %v, %v", recorded, err)
	}
	var n int
	if err := app.QueryRow(ctx, `SELECT count(*) FROM pgfence.once`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("read pgfence.once as pgfence_client: %d rows, %v", n, err)
	}
	var live *bool
	if err := app.QueryRow(ctx, `SELECT pgfence.release_at_least($1, 'app', $2, 0)`, lease, fence).Scan(&live); err != nil || live == nil || !*live {
		t.Fatalf("release_at_least as pgfence_client: %v, %v", live, err)
	}
	for _, q := range []string{
		`INSERT INTO pgfence.once (name, period, fence) VALUES ('sem#1', 'forged', 1)`,
		`DELETE FROM pgfence.once`,
		`UPDATE pgfence.once SET fence = 1`,
		`SELECT pgfence.grant_roles_4()`,
		`SELECT pgfence.grant_roles_6()`,
	} {
		_, err := app.Exec(ctx, q)
		if st := sqlstateOf(err); st != "42501" {
			t.Errorf("%s as pgfence_client: %v, want insufficient_privilege (42501)", q, err)
		}
	}
}
