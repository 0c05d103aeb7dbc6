package leases

import (
	"strings"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// waitKey must equal pgfence.wait_key in the database: a release sends its
// notification only while someone holds the name's wait key as the server
// computes it, so a client that computed another key would hold one
// nobody looks at, and its waiters would learn of releases only by
// polling. Fixed expectations guard against both sides drifting together:
// the first 4 bytes of SHA-256, big-endian, as computed apart (Python's
// hashlib), the high half of the lock keys pglock pins.
func TestWaitKeyMatchesSQL(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := testContext(t)
	fixed := map[string]int32{
		"x":                      762385986,
		"billing":                211142636,
		"billing/nightly-report": -309824007,
		"\u00e9":                 1251562878,
		"\u20ac":                 -993226515,
	}
	names := []string{"Ünïcödé-名前-🔒", "\U0001F512", strings.Repeat("a", 200), strings.Repeat("€", 66)}
	for n := range fixed {
		names = append(names, n)
	}
	rows, err := pool.Query(ctx, `SELECT n, pgfence.wait_key(n) FROM unnest($1::text[]) AS n`, names)
	if err != nil {
		t.Fatalf("query wait_key: %v", err)
	}
	got := map[string]int32{}
	for rows.Next() {
		var n string
		var k int32
		if err := rows.Scan(&n, &k); err != nil {
			t.Fatal(err)
		}
		got[n] = k
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if k, ok := got[n]; !ok || k != waitKey(n) {
			t.Errorf("wait_key(%q) = %d (%v), waitKey = %d", n, k, ok, waitKey(n))
		}
	}
	for n, want := range fixed {
		if waitKey(n) != want {
			t.Errorf("waitKey(%q) = %d, want %d", n, waitKey(n), want)
		}
	}
}
