package pglock

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

var (
	// ErrLocked is returned by TryLock and TryRLock when another session
	// holds the lock in a conflicting mode. No lock is taken and no
	// connection is kept.
	ErrLocked = errors.New("pglock: lock held by another session")

	// ErrStandby means the connection reached a standby (a server in
	// recovery). PostgreSQL grants advisory locks there, but they exclude
	// nobody on the primary, so pglock takes none. Connect to the primary,
	// for example with a multi-host connection string and
	// target_session_attrs=read-write.
	ErrStandby = errors.New("pglock: the server is a standby (in recovery): an advisory lock there excludes nobody on the primary; connect to the primary (target_session_attrs=read-write)")

	// ErrLost means the session that held the lock died or could no longer
	// be reached: the backend was terminated, the server went away, or a
	// liveness check failed. Lock.Err returns it after Done closes for that
	// reason, Unlock and Do return errors wrapping it.
	ErrLost = errors.New("pglock: lock lost: the session holding it died")

	// ErrUnlocked is what Lock.Err returns after Unlock ended the hold.
	ErrUnlocked = errors.New("pglock: lock was unlocked")

	// ErrNilPool is returned by every method of a Locker built over a nil
	// pool.
	ErrNilPool = errors.New("pglock: pool is nil")

	// ErrInvalidName is returned (wrapped, with the reason) for a lock name
	// that is empty, longer than MaxNameLen bytes, not valid UTF-8, or
	// contains a NUL byte. Nothing is locked.
	ErrInvalidName = errors.New("pglock: invalid lock name")
)

// MaxNameLen is the longest lock name in bytes, the same limit as lease
// names in pgfence.leases.
const MaxNameLen = 200

// validateName reports why name cannot be a lock name, or nil. Names must
// be representable as PostgreSQL text so that pgfence.lock_key(name)
// computes the same key as Key(name).
func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: name is empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: name is %d bytes, at most %d allowed", ErrInvalidName, len(name), MaxNameLen)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: name contains a NUL byte", ErrInvalidName)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: name is not valid UTF-8", ErrInvalidName)
	}
	return nil
}
