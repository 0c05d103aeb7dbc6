package migrations_test

import (
	"context"
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestKeysInlined: lock_key and wait_key are inlined into the statements
// that call them (migration 7). A SQL function that is not inlined is
// parsed and planned again on every call, which cost a sixth of every grant
// and of every fenced row write.
func TestKeysInlined(t *testing.T) {
	t.Parallel()
	conn := connect(t, pgtest.URL(t))
	for _, q := range []string{
		`EXPLAIN (VERBOSE, COSTS OFF) SELECT pgfence.wait_key(l.name) FROM pgfence.leases AS l`,
		`EXPLAIN (VERBOSE, COSTS OFF) SELECT pgfence.lock_key(l.name) FROM pgfence.leases AS l`,
	} {
		rows, err := conn.Query(context.Background(), q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		var plan strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if p := plan.String(); strings.Contains(p, "lock_key") || strings.Contains(p, "wait_key") || !strings.Contains(p, "sha256") {
			t.Errorf("%s: not inlined:\n%s", q, p)
		}
	}
}

// TestGrantsCheckNameAndOwner: with the table's CHECK constraints gone
// (migration 7), every grant function rejects a name or owner outside 1 to
// 200 bytes with invalid_parameter_value, and writes nothing.
func TestGrantsCheckNameAndOwner(t *testing.T) {
	t.Parallel()
	conn := connect(t, pgtest.URL(t))
	ctx := context.Background()
	long := strings.Repeat("x", 201)
	cases := []struct {
		what string
		q    string
		args []any
	}{
		{"empty name", `SELECT * FROM pgfence.try_acquire($1, 'o', 60000000, NULL)`, []any{""}},
		{"long name", `SELECT * FROM pgfence.try_acquire($1, 'o', 60000000, NULL)`, []any{long}},
		{"NULL name", `SELECT * FROM pgfence.try_acquire($1, 'o', 60000000, NULL)`, []any{nil}},
		{"empty owner", `SELECT * FROM pgfence.try_acquire('n', $1, 60000000, NULL)`, []any{""}},
		{"long owner", `SELECT * FROM pgfence.try_acquire('n', $1, 60000000, NULL)`, []any{long}},
		{"three arguments, long name", `SELECT * FROM pgfence.try_acquire($1, 'o', 60000000)`, []any{long}},
		{"three arguments, empty owner", `SELECT * FROM pgfence.try_acquire('n', $1, 60000000)`, []any{""}},
		{"slot of a long name", `SELECT * FROM pgfence.try_acquire_slot($1, 3, 'o', 60000000)`, []any{strings.Repeat("s", 199)}},
		{"slot, empty owner", `SELECT * FROM pgfence.try_acquire_slot('s', 3, $1, 60000000)`, []any{""}},
		{"slot, long owner", `SELECT * FROM pgfence.try_acquire_slot('s', 3, $1, 60000000)`, []any{long}},
	}
	for _, c := range cases {
		_, err := conn.Exec(ctx, c.q, c.args...)
		if st := sqlstateOf(err); st != "22023" {
			t.Errorf("%s: %v, want invalid_parameter_value (22023)", c.what, err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pgfence.leases`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written: %d, %v", n, err)
	}
	// The bounds themselves are fine.
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.try_acquire($1, $2, 60000000, NULL)`, strings.Repeat("n", 200), strings.Repeat("o", 200)); err != nil {
		t.Errorf("200-byte name and owner: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT * FROM pgfence.try_acquire_slot($1, 9, 'o', 60000000)`, strings.Repeat("s", 198)); err != nil {
		t.Errorf("slot name of 200 bytes: %v", err)
	}
}
