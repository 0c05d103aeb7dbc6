// Package names validates the names pgfence's packages accept: lock names
// (pglock), lease names and owner ids (leases). One set of rules keeps a
// name that works as a lock working as a lease, and keeps every name
// representable as PostgreSQL text, so that SQL (pgfence.lock_key, the
// grant functions' checks) sees the same bytes as Go.
package names

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxLen is the longest lock or lease name, in bytes; the grant functions
// (pgfence.try_acquire, try_acquire_slot) check the same.
const MaxLen = 200

// Check returns nil if s is 1 to maxLen bytes of valid UTF-8 without NUL,
// and otherwise an error saying why, without a package prefix or the word
// "name", for the caller to wrap as its own invalid-input error:
//
//	must be 1..200 bytes, got 0
//	must not contain NUL (byte 3)
//	must be valid UTF-8 (bad byte at 5)
//
// The messages never echo s: a caller that wants it shown adds it.
func Check(s string, maxLen int) error {
	switch {
	case len(s) == 0 || len(s) > maxLen:
		return fmt.Errorf("must be 1..%d bytes, got %d", maxLen, len(s))
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("must not contain NUL (byte %d)", strings.IndexByte(s, 0))
	case !utf8.ValidString(s):
		return fmt.Errorf("must be valid UTF-8 (bad byte at %d)", firstInvalid(s))
	}
	return nil
}

// ASCII reports whether s is all ASCII: the same bytes in every client
// and database encoding PostgreSQL has.
func ASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// firstInvalid returns the offset of the first byte of s that does not
// start a valid UTF-8 sequence.
func firstInvalid(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return i
			}
		}
	}
	return len(s)
}
