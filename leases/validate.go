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
	switch {
	case name == "":
		return invalid("leases: lease name must not be empty")
	case len(name) > MaxNameLen:
		return invalid(fmt.Sprintf("leases: lease name must be at most %d bytes, got %d", MaxNameLen, len(name)))
	case strings.IndexByte(name, 0) >= 0:
		return invalid(fmt.Sprintf("leases: lease name must not contain NUL, got %q", name))
	case !utf8.ValidString(name):
		return invalid(fmt.Sprintf("leases: lease name must be valid UTF-8, got %q", name))
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
	switch {
	case id == "":
		return invalid("leases: owner id must not be empty")
	case len(id) > MaxOwnerLen:
		return invalid(fmt.Sprintf("leases: owner id must be at most %d bytes, got %d", MaxOwnerLen, len(id)))
	case strings.IndexByte(id, 0) >= 0:
		return invalid(fmt.Sprintf("leases: owner id must not contain NUL, got %q", id))
	case !utf8.ValidString(id):
		return invalid(fmt.Sprintf("leases: owner id must be valid UTF-8, got %q", id))
	}
	return nil
}

// margin is the safety margin subtracted from the TTL to get the local
// deadline: TTL/10 (at least 100ms for the minimum TTL of 1s).
func margin(ttl time.Duration) time.Duration {
	return max(ttl/10, 100*time.Millisecond)
}
