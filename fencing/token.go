package fencing

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Token is a fencing token: proof of one grant of a lease, presented with
// every protected write so that the database can tell the current holder
// from a stale one.
//
// Lease names the lease, Fence the grant's fence: every grant of a lease
// gets a higher fence than the one before, and higher than any a lost
// history (a failover, a restore) can have issued; see the package
// documentation. The guard honours a token only while it is the lease's
// current, unexpired grant, and only when it is not lower than the fence
// stored in the row written. Both fields are required: a fence that names
// no lease could be one that was never issued, so the guard refuses it.
//
// leases.Lease.Token returns the token of a grant. The zero Token is
// invalid: Begin and InTx reject it.
type Token struct {
	Lease string
	Fence int64
}

// maxLeaseName is the longest lease name pgfence.leases accepts, in bytes.
const maxLeaseName = 200

// ErrInvalid matches every bad-input error of the package (an invalid
// token, table name, nil db or nil function): nothing was sent to the
// database, and retrying cannot help. The message says which argument and
// why.
var ErrInvalid = errors.New("fencing: invalid input")

// String formats the token for logs and error messages: "billing#42".
func (t Token) String() string {
	return t.Lease + "#" + strconv.FormatInt(t.Fence, 10)
}

// Validate reports whether the token can be declared: it returns nil, or an
// error wrapping ErrInvalid that says what is wrong. A valid token may
// still be stale; only the database can tell.
func (t Token) Validate() error {
	switch {
	case t.Fence <= 0:
		return fmt.Errorf("%w: token fence must be positive, got %d", ErrInvalid, t.Fence)
	case t.Lease == "":
		return fmt.Errorf("%w: token must name its lease", ErrInvalid)
	case len(t.Lease) > maxLeaseName:
		return fmt.Errorf("%w: token lease name must be at most %d bytes, got %d", ErrInvalid, maxLeaseName, len(t.Lease))
	case !utf8.ValidString(t.Lease) || strings.IndexByte(t.Lease, 0) >= 0:
		return fmt.Errorf("%w: token lease name must be valid UTF-8 without NUL bytes", ErrInvalid)
	}
	return nil
}
