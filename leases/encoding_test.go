package leases

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
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
	latinURL := pgtest.WithSettings(base, "client_encoding=LATIN1")
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

// The other methods that name a lease, a period or data are refused the
// same way over a LATIN1 session: a period key "été" was recorded as
// "Ã©tÃ©", so Once over LATIN1 ran a period that a UTF8 client had done
// (and the other way round); Get, Observe, Holders and RequestHandover
// looked up another name and found nothing held; data was stored as other
// text. ASCII periods and data still work.
func TestNonUTF8ClientEncodingPeriodsReadsAndData(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	base := pgtest.URL(t)
	pool := pgtest.PoolFor(t, base)
	utf := newClient(t, pool)
	latinPool := pgtest.PoolFor(t, pgtest.WithSettings(base, "client_encoding=LATIN1"))
	latin := newClient(t, latinPool)
	const job, period = "enc/job", "2026-été"

	ran := 0
	count := func(context.Context, *Lease) error { ran++; return nil }
	if did, err := utf.Once(ctx, job, period, time.Minute, count); err != nil || !did {
		t.Fatalf("Once by the UTF8 client = %v, %v", did, err)
	}
	did, err := latin.Once(ctx, job, period, time.Minute, count)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "client_encoding is LATIN1") {
		t.Errorf("Once over LATIN1 of a period the UTF8 client did = %v, %v (fn ran %d times); want ErrInvalid naming client_encoding", did, err, ran)
	}
	if _, err := latin.OnceTx(ctx, job, period, time.Minute, func(context.Context, pgx.Tx, *Lease) error { ran++; return nil }); !errors.Is(err, ErrInvalid) {
		t.Errorf("OnceTx over LATIN1 = %v; want ErrInvalid", err)
	}
	if ran != 1 {
		t.Errorf("fn ran %d times for one period, want 1", ran)
	}
	if rec, done, err := latin.OnceDone(ctx, job, period); !errors.Is(err, ErrInvalid) {
		t.Errorf("OnceDone over LATIN1 = %v, %v, %v; want ErrInvalid", rec, done, err)
	}
	l, err := latin.TryAcquire(ctx, job, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	err = fencing.InTx(ctx, latinPool, l.Token(), func(tx pgx.Tx) error {
		_, err := MarkDone(ctx, tx, job, "2027-été")
		return err
	})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("MarkDone over LATIN1 = %v; want ErrInvalid", err)
	}
	if err := l.SetData(ctx, json.RawMessage(`{"où":"ici"}`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetData of non-ASCII data over LATIN1 = %v; want ErrInvalid", err)
	}
	if err := l.SetData(ctx, json.RawMessage(`{"ou":"ici"}`)); err != nil {
		t.Errorf("SetData of ASCII data over LATIN1: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := latin.TryAcquire(ctx, "enc/data", time.Minute, WithData(json.RawMessage(`"là"`))); !errors.Is(err, ErrInvalid) {
		t.Errorf("TryAcquire WithData non-ASCII over LATIN1 = %v; want ErrInvalid", err)
	}

	held := "enc/tenu·e"
	if _, err := utf.TryAcquire(ctx, held, time.Minute); err != nil {
		t.Fatal(err)
	}
	if info, err := latin.Get(ctx, held); !errors.Is(err, ErrInvalid) {
		t.Errorf("Get over LATIN1 of a name a UTF8 client holds = %+v, %v; want ErrInvalid", info, err)
	}
	if ch, err := latin.Observe(ctx, held); !errors.Is(err, ErrInvalid) {
		t.Errorf("Observe over LATIN1 = %v, %v; want ErrInvalid", ch, err)
	}
	if info, err := latin.RequestHandover(ctx, held, time.Second); !errors.Is(err, ErrInvalid) {
		t.Errorf("RequestHandover over LATIN1 = %+v, %v; want ErrInvalid", info, err)
	}
	s, err := latin.Semaphore("enc/sémaphore", 2)
	if err != nil {
		t.Fatal(err)
	}
	if hs, err := s.Holders(ctx); !errors.Is(err, ErrInvalid) {
		t.Errorf("Holders over LATIN1 = %v, %v; want ErrInvalid", hs, err)
	}
	// Nothing was written by the refused calls.
	var rows int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pgfence.once WHERE name = $1)
		+ (SELECT count(*) FROM pgfence.leases WHERE name = 'enc/data' OR name LIKE 'enc/%Ã%')`, job).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Errorf("%d once records and stray lease rows, want 1 (the UTF8 client's record)", rows)
	}
	// ASCII works over LATIN1 as before.
	if did, err := latin.Once(ctx, job, "2026-ete", time.Minute, count); err != nil || !did {
		t.Errorf("Once of an ASCII period over LATIN1 = %v, %v", did, err)
	}
}
