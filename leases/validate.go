package leases

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// invalidError is bad input; its message names the setting.
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(msg string) error { return &invalidError{msg: msg} }

func validateName(name string) error {
	return validateText("lease name", name, MaxNameLen)
}

// validateText checks a name-like input: 1 to max bytes of UTF-8 without
// NUL; what names it in the error.
func validateText(what, s string, max int) error {
	switch {
	case s == "":
		return invalid(fmt.Sprintf("leases: %s must not be empty", what))
	case len(s) > max:
		return invalid(fmt.Sprintf("leases: %s must be at most %d bytes, got %d", what, max, len(s)))
	case strings.IndexByte(s, 0) >= 0:
		return invalid(fmt.Sprintf("leases: %s must not contain NUL, got %q", what, s))
	case !utf8.ValidString(s):
		return invalid(fmt.Sprintf("leases: %s must be valid UTF-8, got %q", what, s))
	}
	return nil
}

func validateTTL(ttl time.Duration) error {
	if ttl < MinTTL {
		return invalid(fmt.Sprintf("leases: ttl must be at least %s, got %s", MinTTL, ttl))
	}
	return nil
}

func validateOwner(id string) error {
	return validateText("owner id", id, MaxOwnerLen)
}

// margin is the safety margin subtracted from the TTL to get the local
// deadline: TTL/10 (at least 100ms for the minimum TTL of 1s).
func margin(ttl time.Duration) time.Duration {
	return max(ttl/10, 100*time.Millisecond)
}
