package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promises (leases doc, "State model" and "Failure handling"; fencing
// doc, "Errors"): a holder paused past its TTL finds its renewals fail —
// even when nobody has taken the lease since — so a lost Lease never
// becomes held again; only the current grant can write its data, while it
// is live by the database clock; and once a token is rejected as stale it
// is never accepted again.
//
// The client gives up a grant at its local deadline before it would send
// such a renewal, so only SQL can try to revive one: here each function
// that names a grant is called with a grant that expired and that nobody
// took over, and the grant's token is then tried on a protected table.

func TestExpiredGrantCannotBeRevived(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(t, pgtest.URL(t))
	if _, err := conn.Exec(ctx, `CREATE TABLE stale_rows (id int PRIMARY KEY, v text, fence bigint);
SELECT pgfence.protect('stale_rows', 'fence')`); err != nil {
		t.Fatal(err)
	}
	fence := grant(t, ctx, conn, "paused", time.Hour)
	ttl := time.Minute.Microseconds()
	// Each attempt starts from the expired grant, so that one that revives
	// it does not hide the next; and must leave it expired.
	attempt := func(what string, call func()) {
		t.Helper()
		expire(t, ctx, conn, "paused", time.Second)
		call()
		var live bool
		if err := conn.QueryRow(ctx, `SELECT expires_at > clock_timestamp() FROM pgfence.leases WHERE name = 'paused'`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live {
			t.Errorf("%s made the expired grant of paused live again", what)
		}
	}

	attempt("renew", func() {
		var until *time.Time
		if err := conn.QueryRow(ctx, `SELECT pgfence.renew('paused', 'owner', $1, $2)`, fence, ttl).Scan(&until); err != nil {
			t.Fatal(err)
		}
		if until != nil {
			t.Errorf("renew of an expired grant extended it to %s, want NULL (lost)", until)
		}
	})
	for _, fn := range []string{"renew_batch", "renew_many"} {
		attempt(fn, func() {
			var (
				renewed *time.Time
				busy    bool
			)
			err := conn.QueryRow(ctx, `SELECT expires_at, busy FROM pgfence.`+fn+`(ARRAY['paused'], ARRAY['owner'], ARRAY[$1::bigint], ARRAY[$2::bigint])`,
				fence, ttl).Scan(&renewed, &busy)
			if err != nil {
				t.Fatal(err)
			}
			if renewed != nil || busy {
				t.Errorf("%s of an expired grant: expires_at %v, busy %v; want NULL, false (lost)", fn, renewed, busy)
			}
		})
	}
	attempt("set_data", func() {
		var ok *bool
		if err := conn.QueryRow(ctx, `SELECT pgfence.set_data('paused', 'owner', $1, '{"leader": "me"}')`, fence).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		var data *string
		if err := conn.QueryRow(ctx, `SELECT metadata::text FROM pgfence.leases WHERE name = 'paused'`).Scan(&data); err != nil {
			t.Fatal(err)
		}
		if ok != nil && *ok {
			t.Errorf("set_data of an expired grant returned true, want false or NULL")
		}
		if data != nil {
			t.Errorf("set_data of an expired grant wrote %s", *data)
		}
	})

	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `CALL pgfence.declare('paused', $1)`, fence); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO stale_rows (id, v) VALUES (1, 'late')`)
		return err
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "PF001" {
		t.Errorf("a write with the expired grant's token after the renewal attempts: %v, want PF001 (stale)", err)
	}
}
