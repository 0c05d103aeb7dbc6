package leases

import (
	"fmt"
	"time"

	"github.com/pgfence/pgfence/internal/names"
)

// invalidError is bad input; its message names the setting.
type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(msg string) error { return &invalidError{msg: msg} }

func validateName(name string) error {
	return validateText("lease name", name, MaxNameLen)
}

// validateText checks a name-like input by the rules pglock's names and the
// command's follow (names.Check: 1 to max bytes of UTF-8 without NUL);
// what names it in the error.
func validateText(what, s string, max int) error {
	if err := names.Check(s, max); err != nil {
		return invalid(fmt.Sprintf("leases: %s %v", what, err))
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
