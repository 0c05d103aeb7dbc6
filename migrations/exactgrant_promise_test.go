package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promise (docs/design.md, "Three primitives" and "Threat model";
// leases doc, "State model"): a renewal or a release — and a write of the
// lease's data — matches only the exact grant it names, (name, owner,
// fence), so one made for an earlier grant never touches a later one, even
// when both grants had the same owner (SQL callers choose owners freely),
// nor a grant whose owner it does not name.
//
// Each function that names a grant is called with a near miss of the
// current grant — the previous grant's fence with the same owner, the
// current fence with another owner, another lease's name — and must leave
// the row exactly as it was.

func TestOnlyTheExactGrantMatches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(t, pgtest.URL(t))

	old := grant(t, ctx, conn, "exact", time.Minute)
	expire(t, ctx, conn, "exact", time.Second)
	cur := grant(t, ctx, conn, "exact", time.Minute) // the same owner, 'owner'
	grant(t, ctx, conn, "other", time.Minute)
	if _, err := conn.Exec(ctx, `SELECT pgfence.set_data('exact', 'owner', $1, '{"v": 1}')`, cur); err != nil {
		t.Fatal(err)
	}
	read := func() grantRow {
		t.Helper()
		var r grantRow
		err := conn.QueryRow(ctx, `SELECT owner, fence, expires_at, coalesce(metadata::text, '') FROM pgfence.leases WHERE name = 'exact'`).
			Scan(&r.owner, &r.fence, &r.expiresAt, &r.data)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := read()

	misses := []struct {
		what        string
		name, owner string
		fence       int64
	}{
		{"the previous grant (same owner, its fence)", "exact", "owner", old},
		{"another owner with the current fence", "exact", "thief", cur},
		{"the current grant's owner and fence under another name", "other", "owner", cur},
	}
	calls := []struct {
		fn, q string
	}{
		{"renew", `SELECT pgfence.renew($1, $2, $3, 3600000000) IS NOT NULL`},
		{"renew_batch", `SELECT bool_or(expires_at IS NOT NULL) FROM pgfence.renew_batch(ARRAY[$1], ARRAY[$2], ARRAY[$3::bigint], ARRAY[3600000000::bigint])`},
		{"renew_many", `SELECT bool_or(expires_at IS NOT NULL) FROM pgfence.renew_many(ARRAY[$1], ARRAY[$2], ARRAY[$3::bigint], ARRAY[3600000000::bigint])`},
		{"release", `SELECT coalesce(pgfence.release($1, $2, $3), false)`},
		{"release_many", `SELECT count(*) > 0 FROM pgfence.release_many(ARRAY[$1], ARRAY[$2], ARRAY[$3::bigint])`},
		{"release_at_least", `SELECT coalesce(pgfence.release_at_least($1, $2, $3, 0), false)`},
		{"set_data", `SELECT coalesce(pgfence.set_data($1, $2, $3, '{"v": 2}'), false)`},
	}
	for _, m := range misses {
		for _, c := range calls {
			var matched bool
			if err := conn.QueryRow(ctx, c.q, m.name, m.owner, m.fence).Scan(&matched); err != nil {
				t.Fatalf("%s of %s: %v", c.fn, m.what, err)
			}
			if matched {
				t.Errorf("%s of %s reported a match", c.fn, m.what)
			}
			if got := read(); !got.same(want) {
				t.Errorf("%s of %s changed the current grant: %s, was %s", c.fn, m.what, got, want)
				// Put it back, so that the next call is tried on it.
				if _, err := conn.Exec(ctx, `UPDATE pgfence.leases SET owner = $1, fence = $2, expires_at = $3, metadata = $4::jsonb WHERE name = 'exact'`,
					want.owner, want.fence, want.expiresAt, want.data); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// grantRow is a lease's row as TestOnlyTheExactGrantMatches compares it.
type grantRow struct {
	owner     string
	fence     int64
	expiresAt time.Time
	data      string
}

func (r grantRow) same(o grantRow) bool {
	return r.owner == o.owner && r.fence == o.fence && r.expiresAt.Equal(o.expiresAt) && r.data == o.data
}

func (r grantRow) String() string {
	return fmt.Sprintf("owner %q fence %d expires %s data %s", r.owner, r.fence, r.expiresAt.UTC().Format(time.RFC3339Nano), r.data)
}
