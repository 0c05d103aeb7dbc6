package migrations_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestUpInADatabaseNotInUTF8: the migration files are UTF-8 (some
// comments and messages hold characters beyond ASCII), and PostgreSQL
// reads a statement in the connection's client_encoding, which defaults
// to the database's. Up and Down must work in a database of any server
// encoding, whatever client_encoding the URL asks for, and store the
// functions as written: an EUC_JP database refused migration 3's "×" as
// an invalid byte sequence (and a LATIN1 one stored it as "Ã\u0097"
// until migration 4 dropped that function).
func TestUpInADatabaseNotInUTF8(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	want := functions(t, pgtest.EmptyURL(t))
	if len(want) < 10 {
		t.Fatalf("%d functions in schema pgfence: the test checks too little", len(want))
	}
	for _, enc := range []string{"EUC_JP", "LATIN1", "SQL_ASCII"} {
		t.Run(enc, func(t *testing.T) {
			t.Parallel()
			u := pgtest.EmptyURLEncoded(t, enc)
			for _, param := range []string{"", "client_encoding=" + enc} {
				if err := migrations.Up(ctx, withParam(u, param)); err != nil {
					t.Fatalf("Up (URL with %q): %v", param, err)
				}
				got := functions(t, u)
				for name, src := range want {
					if got[name] != src {
						t.Errorf("Up (URL with %q): %s stored as %q, want %q", param, name, got[name], src)
					}
				}
				if err := migrations.Down(ctx, withParam(u, param)); err != nil {
					t.Fatalf("Down (URL with %q): %v", param, err)
				}
			}
		})
	}
}

// TestMigrationFilesAreASCII keeps TestUpInADatabaseNotInUTF8 true for the
// files to come, through any tool (golang-migrate's CLI included, whose
// connection keeps the database's client_encoding): a character beyond
// ASCII, even in a comment, is converted with the statement, and some
// server encodings have no equivalent for it (LATIN1 has none for "—").
func TestMigrationFilesAreASCII(t *testing.T) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil || len(names) == 0 {
		t.Fatalf("migration files: %v, %v", names, err)
	}
	for _, name := range names {
		b, err := fs.ReadFile(migrations.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, r := range line {
				if r > 0x7e || (r < 0x20 && r != '\t' && r != '\r') {
					t.Errorf("%s:%d: character %q beyond printable ASCII", name, i+1, r)
					break
				}
			}
		}
	}
}

// functions migrates the database at u (a no-op when it is) and returns
// the source of pgfence's functions, read in UTF-8.
func functions(t *testing.T, u string) map[string]string {
	t.Helper()
	ctx := context.Background()
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatal(err)
	}
	conn := connect(t, withParam(u, "client_encoding=UTF8"))
	rows, err := conn.Query(ctx, `
SELECT p.oid::regprocedure::text, p.prosrc FROM pg_proc AS p
 WHERE p.pronamespace = 'pgfence'::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	m := map[string]string{}
	for rows.Next() {
		var name, src string
		if err := rows.Scan(&name, &src); err != nil {
			t.Fatal(err)
		}
		m[name] = src
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// withParam adds a query parameter (if any) to the URL u.
func withParam(u, param string) string {
	switch {
	case param == "":
		return u
	case strings.Contains(u, "?"):
		return u + "&" + param
	}
	return u + "?" + param
}
