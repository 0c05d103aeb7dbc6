package leases

import (
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// A session whose client_encoding is LATIN1 (a role's default, here the
// connection's options) reads Go's UTF-8 bytes as Latin-1: "café" was
// stored as "cafÃ©", and granted to a LATIN1 client while a UTF8 client
// held "café" — two holders of one lease. A name that is not ASCII is
// refused over such a session now (ErrInvalid, naming the setting and
// writing nothing); ASCII names, the same text in every encoding, work and
// contend with UTF8 clients as before. Over pgx and database/sql.
func TestNonUTF8ClientEncoding(t *testing.T) {
	t.Parallel()
	base := pgtest.URL(t)
	latinURL := withOptions(base, "client_encoding=LATIN1")
	for _, driver := range []string{"pgx", "database/sql"} {
		t.Run(driver, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			pool := pgtest.PoolFor(t, base)
			utf := newClient(t, pool)
			var latin *Client
			if driver == "pgx" {
				latin = newClient(t, pgtest.PoolFor(t, latinURL))
			} else {
				db, err := sql.Open("pgx", latinURL)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = db.Close() })
				if latin, err = NewDB(db); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = latin.Close() })
			}
			var enc string
			if err := latin.q.QueryRow(ctx, `SHOW client_encoding`).Scan(&enc); err != nil || enc != "LATIN1" {
				t.Fatalf("the LATIN1 client's client_encoding = %q, %v; want LATIN1", enc, err)
			}
			name := driver + "/café"
			if _, err := utf.TryAcquire(ctx, name, time.Minute); err != nil {
				t.Fatal(err)
			}
			l, err := latin.TryAcquire(ctx, name, time.Minute)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "client_encoding is LATIN1") {
				t.Errorf("TryAcquire of %q held by a UTF8 client, over LATIN1 = %v, %v; want ErrInvalid naming client_encoding", name, l, err)
			}
			s, err := latin.Semaphore(driver+"/sémaphore", 2)
			if err != nil {
				t.Fatal(err)
			}
			if l, err := s.TryAcquire(ctx, time.Minute); !errors.Is(err, ErrInvalid) {
				t.Errorf("Semaphore.TryAcquire of a non-ASCII name over LATIN1 = %v, %v; want ErrInvalid", l, err)
			}
			if err := latin.ForceRelease(ctx, name); !errors.Is(err, ErrInvalid) {
				t.Errorf("ForceRelease of a non-ASCII name over LATIN1 = %v; want ErrInvalid", err)
			}
			// Nothing written: only the UTF8 client's grant.
			var rows int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases WHERE name LIKE $1`, driver+"/%").Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != 1 {
				t.Errorf("%d lease rows under %s/, want 1 (the UTF8 client's)", rows, driver)
			}
			// ASCII names are the same lease whatever the encoding.
			ascii := driver + "/cafe"
			if _, err := latin.TryAcquire(ctx, ascii, time.Minute); err != nil {
				t.Fatalf("TryAcquire of an ASCII name over LATIN1: %v", err)
			}
			if _, err := utf.TryAcquire(ctx, ascii, time.Minute); !errors.Is(err, ErrHeld) {
				t.Errorf("TryAcquire by a UTF8 client of %q held over LATIN1 = %v, want ErrHeld", ascii, err)
			}
		})
	}
}
