package pgtest

import (
	"context"
	"crypto/rand"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// LoginRole creates, as u's role, a login role with a random name and a
// random password (a server the tests share may ask for one: scram-sha-256
// over TCP is Debian's default), with options added to its CREATE ROLE
// ("IN ROLE pgfence_client", "CREATEDB"; trusted text, not input). It
// returns the role's name and u, a URL, rewritten to log in as it.
//
// When t ends, or if t fails after the role exists, the role goes with
// what it left: its sessions are ended, the databases it owns dropped, the
// objects it owns in u's database dropped (DROP OWNED BY, which also
// revokes its privileges there) and the role dropped; a failure of that is
// t's error. The password appears in no error or log line.
func LoginRole(t testing.TB, u, options string) (name, roleURL string) {
	t.Helper()
	ru, err := url.Parse(u)
	if err != nil || ru.Scheme == "" {
		t.Fatalf("pgtest: LoginRole needs a URL-form database URL (%v)", err)
	}
	name, password := "pgfence_role_"+strings.ToLower(rand.Text()[:12]), rand.Text()
	id := pgx.Identifier{name}.Sanitize()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: create role %s: %v", name, err)
	}
	defer admin.Close(context.Background())
	// Not printed on failure: the statement carries the password.
	if _, err := admin.Exec(ctx, "CREATE ROLE "+id+" LOGIN "+options+" PASSWORD '"+password+"'"); err != nil {
		t.Fatalf("pgtest: create role %s %s: %v", name, options, err)
	}
	t.Cleanup(func() { dropRole(t, u, name) })
	ru.User = url.UserPassword(name, password)
	return name, ru.String()
}

// dropRole drops the role name and what it left, as LoginRole says,
// reporting failures as t's errors.
func dropRole(t testing.TB, u, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Errorf("pgtest: drop role %s: %v", name, err)
		return
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity WHERE usename = $1`, name); err != nil {
		t.Errorf("pgtest: end the sessions of role %s: %v", name, err)
	}
	rows, _ := admin.Query(ctx, `SELECT datname FROM pg_database WHERE datdba = (SELECT oid FROM pg_roles WHERE rolname = $1)`, name)
	dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Errorf("pgtest: the databases of role %s: %v", name, err)
	}
	id := pgx.Identifier{name}.Sanitize()
	var qs []string
	for _, db := range dbs {
		db := pgx.Identifier{db}.Sanitize()
		qs = append(qs, "ALTER DATABASE "+db+" WITH IS_TEMPLATE false", "DROP DATABASE "+db+" WITH (FORCE)")
	}
	for _, q := range append(qs, "DROP OWNED BY "+id, "DROP ROLE "+id) {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Errorf("pgtest: %s: %v", q, err)
		}
	}
}
