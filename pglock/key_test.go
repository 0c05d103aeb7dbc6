package pglock

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// Key must equal pgfence.lock_key in the database, for every name an
// operator can type.
func TestKeyMatchesSQLLockKey(t *testing.T) {
	t.Parallel()
	pool, _ := setup(t)
	ctx := testContext(t)

	names := []string{
		"x",
		"billing",
		"billing/nightly-report",
		"Ünïcödé-名前-🔒",
		"\u00e9",     // 2-byte UTF-8
		"\u20ac",     // 3-byte UTF-8
		"\U0001F512", // 4-byte UTF-8
		strings.Repeat("a", 200),
		strings.Repeat("€", 70), // 210 bytes: Key does not validate
		strings.Repeat("long name ", 30),
	}
	// Fixed expectations guard against both sides drifting together: the
	// first 8 bytes of SHA-256, big-endian, as computed apart (Python's
	// hashlib) and pinned here.
	fixed := map[string]int64{
		"x":                      3274422879871479876,
		"billing":                906850720199613079,
		"billing/nightly-report": -1330683975594955111,
		"\u00e9":                 5375421630974772051,
		"\u20ac":                 -4265875398419091155,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		names = append(names, randomName(rng))
	}
	rows, err := pool.Query(ctx, `SELECT n, pgfence.lock_key(n) FROM unnest($1::text[]) AS n`, names)
	if err != nil {
		t.Fatalf("query lock_key: %v", err)
	}
	got := map[string]int64{}
	for rows.Next() {
		var n string
		var k int64
		if err := rows.Scan(&n, &k); err != nil {
			t.Fatal(err)
		}
		got[n] = k
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, n := range names {
		k, ok := got[n]
		if !ok {
			t.Errorf("database returned no key for %q", n)
			continue
		}
		if k != Key(n) {
			t.Errorf("lock_key(%q) = %d, Key = %d", n, k, Key(n))
		}
		checked++
	}
	for n, want := range fixed {
		if Key(n) != want {
			t.Errorf("Key(%q) = %d, want %d", n, Key(n), want)
		}
	}
	t.Logf("checked %d names against pgfence.lock_key", checked)
}

// randomName returns 1..60 random runes from ASCII and beyond, never NUL.
func randomName(rng *rand.Rand) string {
	var b strings.Builder
	for range 1 + rng.IntN(60) {
		var r rune
		switch rng.IntN(4) {
		case 0, 1:
			r = rune(1 + rng.IntN(0x7f))
		case 2:
			r = rune(0x80 + rng.IntN(0x800-0x80))
		default:
			r = rune(0x800 + rng.IntN(0x10ffff-0x800))
		}
		if !utf8.ValidRune(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}
