package fencing_test

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
)

// FuzzForgedDeclaration (scenario: forged tokens). A writer sets
// pgfence.token by hand, to any value, in its own transaction, and writes a
// protected row under READ COMMITTED (the guard's fast path) or REPEATABLE
// READ (token_fence). The write lands exactly when the value is the
// declaration declare_token would make for the live grant: "xid:fence:lease"
// with this transaction's xid, the grant's fence as int8out writes it and
// the lease's name. Anything else is refused with PF001 or PF002 — never
// accepted, and never another error (a cast overflowing, say) that a
// caller could not classify; a value that is not valid text is refused by
// the server before the guard runs (22021). In the value, {X} stands for
// this transaction's xid and {F} for the holder's fence, so that the
// fuzzer reaches the neighbourhood of the one right answer. The seeds run
// in every go test; go test -fuzz FuzzForgedDeclaration ./fencing/
// explores further.
func FuzzForgedDeclaration(f *testing.F) {
	pool := setup(f)
	tok := grant(f, pool, "job", time.Hour)
	for _, s := range []string{
		"{X}:{F}:job", // the one right answer
		"{X}:{F}:jo", "{X}:{F}:job ", "{X}:{F}:JOB", "{X}:{F}:never", "{X}:{F}:job:x", "{X}:{F}:job\x00",
		"{X}:{F}:", "{X}:{F}", "{X}:{F}:%", "{X}:{F}:_ob", "{X}:{F}:job' OR true --",
		"{X}:0{F}:job", "{X}:+{F}:job", "{X}:{F}0:job", "{X}:-{F}:job", "{X}: {F}:job", "{X}:{F}.0:job",
		"{X}:99999999999999999999:job", "{X}:9223372036854775808:job", "{X}:-1:job", "{X}::job",
		"{X}:1e3:job", "{X}:\u0663:job", "{X}:0x1:job",
		":{F}:job", "1:{F}:job", "{X}0:{F}:job", "0{X}:{F}:job", " {X}:{F}:job", "{X}{X}:{F}:job",
		"", ":", "::", ":::", strings.Repeat(":", 300), "{X}:{F}:" + strings.Repeat("a", 300), "\xff", "{X}:{F}:\xc3",
	} {
		for iso := range uint8(2) {
			f.Add(s, iso)
		}
	}
	levels := []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead}
	fence := strconv.FormatInt(tok.Fence, 10)
	f.Fuzz(func(t *testing.T, value string, iso uint8) {
		if int(iso) >= len(levels) {
			t.Skip("no such isolation level")
		}
		tx, err := pool.BeginTx(bg, pgx.TxOptions{IsoLevel: levels[iso]})
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(bg) }()
		var xid string
		if err := tx.QueryRow(bg, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		decl := strings.ReplaceAll(strings.ReplaceAll(value, "{X}", xid), "{F}", fence)
		right := decl == xid+":"+fence+":"+tok.Lease
		_, err = tx.Exec(bg, `SELECT set_config('pgfence.token', $1, true)`, decl)
		if err != nil {
			if code := sqlState(err); code != "22021" || (utf8.ValidString(decl) && !strings.Contains(decl, "\x00")) {
				t.Fatalf("set_config(%q): %v", decl, err)
			}
			return // not text: refused before any write
		}
		_, err = tx.Exec(bg, upsertItem, 1, "fuzzed")
		switch code := sqlState(err); {
		case right && err != nil:
			t.Errorf("%s, the holder's own declaration %q: %v, want the write to land", levels[iso], decl, err)
		case !right && err == nil:
			t.Errorf("%s, forged declaration %q (the holder's fence is %s): the write landed", levels[iso], decl, fence)
		case err != nil && code != fencing.SQLStateStale && code != fencing.SQLStateNoToken:
			t.Errorf("%s, declaration %q: %v, want PF001 or PF002", levels[iso], decl, err)
		}
	})
}
