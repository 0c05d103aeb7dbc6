package fencing

import (
	"errors"
	"fmt"
	"strconv"
)

// Token is a fencing token: proof of one grant of a lease, presented with
// every protected write so that the database can tell a current holder from
// a stale one.
//
// Fence is the grant's fence, taken from pgfence.fence_seq: every grant of
// every lease gets a higher one, so a later holder always carries a higher
// fence than an earlier one. It must be positive.
//
// Lease names the lease that granted Fence. When it is set, the guard also
// checks that Fence is still that lease's current, unexpired grant — which
// rejects a paused holder even before its successor has written anything.
// Leave it empty for a fence-only token (a fence from elsewhere, or a
// resource shared by several leases); then only the row comparison applies.
// Lease names are at most 200 bytes, as in pgfence.leases.
//
// leases.Lease.Token returns the token of a lease grant. The zero Token is
// invalid: Begin and InTx reject it.
type Token struct {
	Lease string
	Fence int64
}

// maxLeaseName is the longest lease name pgfence.leases accepts, in bytes.
const maxLeaseName = 200

// ErrInvalidToken is returned (wrapped, with the reason) by Begin and InTx
// for a token they refuse to declare: a fence that is not positive, or a
// lease name longer than any lease can have. Nothing is sent to the database.
var ErrInvalidToken = errors.New("fencing: invalid token")

// String formats the token for logs and error messages: "billing#42", or
// "#42" for a fence-only token.
func (t Token) String() string {
	return t.Lease + "#" + strconv.FormatInt(t.Fence, 10)
}

// Validate reports whether the token can be declared: it returns nil, or an
// error wrapping ErrInvalidToken that says what is wrong. A valid token may
// still be stale; only the database can tell.
func (t Token) Validate() error {
	if t.Fence <= 0 {
		return fmt.Errorf("%w: fence must be positive, got %d", ErrInvalidToken, t.Fence)
	}
	if len(t.Lease) > maxLeaseName {
		return fmt.Errorf("%w: lease name must be at most %d bytes, got %d", ErrInvalidToken, maxLeaseName, len(t.Lease))
	}
	return nil
}
