package names

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	cases := []struct {
		s    string
		max  int
		want string // "" for valid
	}{
		{"a", MaxLen, ""},
		{"billing/nightly-report", MaxLen, ""},
		{"naïve ✓", MaxLen, ""},
		{strings.Repeat("n", MaxLen), MaxLen, ""},
		{"", MaxLen, "must be 1..200 bytes, got 0"},
		{strings.Repeat("n", MaxLen+1), MaxLen, "must be 1..200 bytes, got 201"},
		{"abcd", 3, "must be 1..3 bytes, got 4"},
		{"a\x00b", MaxLen, "must not contain NUL (byte 1)"},
		{"ab\xffc", MaxLen, "must be valid UTF-8 (bad byte at 2)"},
		{"\uFFFDx\xc3", MaxLen, "must be valid UTF-8 (bad byte at 4)"}, // an encoded U+FFFD is valid
	}
	for _, c := range cases {
		err := Check(c.s, c.max)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("Check(%q, %d) = %q, want %q", c.s, c.max, got, c.want)
		}
	}
}

func TestASCII(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{"": true, "job/1 #x": true, "\x7f": true, "café": false, "\x80": false, "a\xffb": false} {
		if got := ASCII(s); got != want {
			t.Errorf("ASCII(%q) = %v, want %v", s, got, want)
		}
	}
}
