package leases

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// FuzzNameAgreesWithServer: the lease names the client refuses as invalid
// input (validateName) are exactly the ones the server's grant refuses, so
// no name passes the client's check only to fail in SQL with a database
// error, and the client refuses nothing the server would store. Each
// input is tried on a real grant (pgfence.try_acquire) in a transaction
// that is rolled back. The seeds run in every go test; go test -fuzz
// FuzzNameAgreesWithServer ./leases/ explores further.
func FuzzNameAgreesWithServer(f *testing.F) {
	pool := pgtest.Pool(f)
	for _, s := range []string{
		"", "a", "job/nightly", "sem#3", "a\x00b", "\x00",
		strings.Repeat("a", MaxNameLen), strings.Repeat("a", MaxNameLen+1),
		strings.Repeat("é", MaxNameLen/2), strings.Repeat("é", MaxNameLen/2) + "a", // 200 and 201 bytes
		"\xff", "\xc3", "a\xc3(", "\xc0\x80", // invalid, truncated, overlong
		"\xed\xa0\x80", "\xf4\x90\x80\x80", // a surrogate, beyond U+10FFFF
		"\U0010FFFF", "\uFEFF", "日本語",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clientErr := validateName(name)
		serverErr := tryGrant(t, pool, name)
		switch {
		case clientErr == nil && serverErr != nil:
			t.Errorf("name %q: the client accepts it, the server refuses it: %v", name, serverErr)
		case clientErr != nil && serverErr == nil:
			t.Errorf("name %q: the client refuses it (%v), the server grants it", name, clientErr)
		}
	})
}

// tryGrant tries a grant of name on the server and rolls it back.
func tryGrant(t *testing.T, pool *pgxpool.Pool, name string) error {
	ctx := testContext(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT * FROM pgfence.try_acquire($1, 'fuzz', 60000000, NULL)`, name)
	return err
}
