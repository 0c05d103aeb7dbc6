package migrations_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestNotices: what the migrations could not do for want of privileges
// they say in notices, and docs/operators.md tells operators to read
// them; Up and Down dropped them. WithNotices passes on pgfence's own
// (message and hint), not PostgreSQL's. In a cluster of the test's own,
// a role that owns its databases and nothing else migrates the first
// one (it may not create the roles), and, after a superuser created the
// roles without the membership, a second (it may not grant it), then
// reverts it (it may not drop the roles).
func TestNotices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := pgtest.StartCluster(t) // the roles are cluster-wide: a cluster of the test's own
	admin := connect(t, c.URL("postgres"))
	for _, q := range []string{
		`CREATE ROLE migr LOGIN`,
		`CREATE DATABASE first OWNER migr`,
		`CREATE DATABASE second OWNER migr`,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	as := func(db string) string {
		u, err := url.Parse(c.URL(db))
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User("migr")
		return u.String()
	}
	var got []string
	collect := migrations.WithNotices(func(message, hint string) {
		got = append(got, message+" | "+hint)
	})
	expect := func(step string, want ...string) {
		t.Helper()
		for _, w := range want {
			found := false
			for _, g := range got {
				found = found || strings.Contains(g, w)
			}
			if !found {
				t.Errorf("%s: no notice containing %q among %q", step, w, got)
			}
		}
		for _, g := range got {
			if !strings.HasPrefix(g, "pgfence: ") {
				t.Errorf("%s: notice %q is not pgfence's", step, g)
			}
		}
		got = nil
	}

	if err := migrations.Up(ctx, as("first"), collect); err != nil {
		t.Fatalf("Up of the first database by a role that may not create roles: %v", err)
	}
	expect("first database", "this role may not create roles", "CREATE ROLE pgfence_client NOLOGIN")

	for _, q := range []string{`CREATE ROLE pgfence_client NOLOGIN`, `CREATE ROLE pgfence_operator NOLOGIN`} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := migrations.Up(ctx, as("second"), collect); err != nil {
		t.Fatalf("Up of a second database by a role that may not grant the roles: %v", err)
	}
	expect("second database", "could not grant pgfence_client to pgfence_operator", "GRANT pgfence_client TO pgfence_operator")

	if err := migrations.Down(ctx, as("second"), collect); err != nil {
		t.Fatalf("Down by a role that may not drop the roles: %v", err)
	}
	expect("down", "roles pgfence_client and pgfence_operator kept")

	for name, opt := range map[string]migrations.Option{"nil option": nil, "nil function": migrations.WithNotices(nil)} {
		if err := migrations.Up(ctx, as("second"), opt); !errors.Is(err, migrations.ErrInvalid) {
			t.Errorf("Up with a %s = %v, want ErrInvalid", name, err)
		}
	}
	if v, _, err := migrations.Version(ctx, as("second")); err != nil || v != 0 {
		t.Errorf("after Up with bad options, version %d, %v; want 0 (nothing applied)", v, err)
	}
}
