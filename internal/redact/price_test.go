package redact

import (
	"math/rand/v2"
	"testing"
)

// TestMaskingPrice measures what docs/operators.md says masking pieces of
// 3 bytes costs: the share of random passwords that mask part of at least
// one of three messages the command prints, by the password's alphabet
// (seeded: the figures are the same on every run). A hex password should
// cost far more than one of letters and digits; the doc gives the figures
// this logs.
func TestMaskingPrice(t *testing.T) {
	msgs := []string{
		`pgfence: lease "once/job" is held by vm/18729-3067b2f108c4e3f3 (fence 1796610972958833, expires in 59.9s)`,
		`pgfence: bump fences: read-only transaction: connected to a standby, or the role or database sets default_transaction_read_only = on; use the primary (e.g. a multi-host connection string with target_session_attrs=read-write) with a role that may write (ERROR: cannot execute SELECT FOR UPDATE in a read-only transaction (SQLSTATE 25006))`,
		`pgfence: the role lacks privileges on schema pgfence: GRANT pgfence_client (or pgfence_operator, for force-release, fence bump and check) TO it: check for the pgfence schema: ERROR: permission denied for schema pgfence (SQLSTATE 42501)`,
	}
	const n = 10000
	price := func(alphabet string, length int) float64 {
		r := rand.New(rand.NewPCG(1, 2))
		masked := 0
		for range n {
			pw := make([]byte, length)
			for i := range pw {
				pw[i] = alphabet[r.IntN(len(alphabet))]
			}
			for _, m := range msgs {
				if String(m, []string{string(pw)}) != m {
					masked++
					break
				}
			}
		}
		return 100 * float64(masked) / n
	}
	hex := price("0123456789abcdef", 32)
	alnum := price("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", 24)
	t.Logf("masked part of a message: 32 hex digits %.1f %%, 24 letters and digits %.1f %%", hex, alnum)
	if hex < 10 || alnum > 5 {
		t.Errorf("hex %.1f %%, letters and digits %.1f %%: docs/operators.md's figures no longer hold", hex, alnum)
	}
}
