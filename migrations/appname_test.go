package migrations_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestUpNamesItsConnection (scenario: an operator's migration waits behind
// an application's long transaction, and the application waits behind the
// migration). pg_stat_activity names the migration's backend, so the
// operator can tell what waits on what; a name in the URL is kept.
func TestUpNamesItsConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	// Observed from a connection of its own: in the blocker's transaction
	// pg_stat_activity would be a snapshot taken at its first read.
	observer := connect(t, u)
	named, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := named.Query()
	q.Set("application_name", "deploy-42")
	named.RawQuery = q.Encode()
	for _, tc := range []struct{ url, want string }{
		{u, "pgfence migrations"},
		{named.String(), "deploy-42"},
	} {
		blocker := connect(t, u)
		tx, err := blocker.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE `+pgx.Identifier{migrations.Table}.Sanitize()+` IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- migrations.Up(ctx, tc.url) }()
		var app string
		pgtest.WaitFor(t, 30*time.Second, "Up to wait behind the lock", func() bool {
			err := observer.QueryRow(ctx, `SELECT application_name FROM pg_stat_activity
  WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&app)
			return err == nil
		})
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("Up: %v", err)
		}
		if app != tc.want {
			t.Errorf("application_name of Up's connection = %q, want %q", app, tc.want)
		}
	}
}
