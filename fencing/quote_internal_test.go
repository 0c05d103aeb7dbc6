package fencing

import "testing"

func TestQuoteLease(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"billing", `E'billing'`},
		{`o'brien`, `E'o''brien'`},
		{`a\b`, `E'a\\b'`},
		{"ü", `E'\u00fc'`},
		{"🦀", `E'\U0001f980'`},
		{"a\tb\x7f", `E'a\u0009b\u007f'`},
	} {
		if got := quoteLease(c.in); got != c.want {
			t.Errorf("quoteLease(%q) = %s, want %s", c.in, got, c.want)
		}
	}
}
