package pglock

import (
	"crypto/sha256"
	"encoding/binary"
)

// Key returns the advisory-lock key of name: the first 8 bytes of the
// SHA-256 of name's bytes (UTF-8), read big-endian as a signed int64.
//
// It equals the SQL function pgfence.lock_key(name), so an operator can
// contend with the library from psql:
//
//	SELECT pg_advisory_lock(pgfence.lock_key('billing'));
//
// Key is a pure function and does not validate name; Lock and its siblings
// do.
func Key(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}
