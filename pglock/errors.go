package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pgfence/pgfence/internal/names"
	"github.com/pgfence/pgfence/internal/pgerr"
)

var (
	// ErrInvalid matches every bad-input error: an invalid name, an empty
	// set of names, a nil pool, context, callback, transaction or Lock, an
	// invalid option.
	// Nothing was taken and retrying cannot help. The error's text names
	// the argument and why: "pglock: invalid name: must be 1..200 bytes,
	// got 0".
	ErrInvalid = errors.New("pglock: invalid input")

	// ErrLocked matches the error TryLock, TryRLock and TryLockAll return
	// when another session holds a lock in a conflicting mode. That error
	// is (or, from TryLockAll, wraps) a *HeldError naming the holders. No
	// lock is taken and no connection kept.
	ErrLocked = errors.New("pglock: lock held by another session")

	// ErrLost is the cause of a Lock's Context once its session died or
	// could no longer be reached (terminated backend, server gone, failed
	// liveness check), or when Unlock found the session no longer held
	// the lock. Unlock and Do return errors wrapping it.
	ErrLost = errors.New("pglock: lock lost")

	// ErrUnlocked is the cause of a Lock's Context after Unlock ended the
	// hold.
	ErrUnlocked = errors.New("pglock: lock unlocked")

	// ErrStandby means the connection reached a standby (a server in
	// recovery): advisory locks there exclude nobody on the primary, so
	// pglock takes none.
	ErrStandby = errors.New("pglock: server is a standby (in recovery)")
)

// opError is an error of op on the lock name, or on a set of names. Its
// text starts with "pglock: " exactly once, whatever it wraps: pglock:
// unlock "x": lock lost; pglock: lock all ["a" "b"]: context canceled.
type opError struct {
	op    string
	names []string // one, or the set in the order it is taken
	err   error
}

func (e *opError) Error() string {
	return fmt.Sprintf("pglock: %s %s: %s", e.op, quoteNames(e.names), strings.TrimPrefix(e.err.Error(), "pglock: "))
}

// maxShownNames is how many of a set's names its errors, log records and
// metrics show: a set of thousands made each of hundreds of kilobytes.
const maxShownNames = 5

// quoteNames quotes one name as it is, and a set as ["a" "b" …], its first
// maxShownNames names followed by how many more there are.
func quoteNames(names []string) string {
	if len(names) == 1 {
		return strconv.Quote(names[0])
	}
	var b strings.Builder
	b.WriteByte('[')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i == maxShownNames {
			fmt.Fprintf(&b, "and %d more", len(names)-i)
			break
		}
		b.WriteString(strconv.Quote(n))
	}
	b.WriteByte(']')
	return b.String()
}

func (e *opError) Unwrap() error { return e.err }

func opErr(op, name string, err error) error {
	return &opError{op: op, names: []string{name}, err: err}
}

// MaxNameLen is the longest lock name in bytes, the same limit as lease
// names.
const MaxNameLen = names.MaxLen

// invalidError is bad input. It matches ErrInvalid; its text names the
// argument and why.
type invalidError struct{ arg, why string }

func (e *invalidError) Error() string        { return "pglock: invalid " + e.arg + ": " + e.why }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(arg, why string) error { return &invalidError{arg: arg, why: why} }

// checkName validates a lock name by the rules lease names follow.
func checkName(name string) error { return checkNameArg("name", name) }

// checkNameArg is checkName for the argument arg ("names[2]").
func checkNameArg(arg, name string) error {
	if err := names.Check(name, MaxNameLen); err != nil {
		return invalid(arg, err.Error())
	}
	return nil
}

// checkCall validates the arguments every lock-taking call shares.
func checkCall(ctx context.Context, name string) error {
	if ctx == nil {
		return invalid("context", "is nil")
	}
	return checkName(name)
}

// HeldError is the error TryLock and TryRLock return when another session
// holds the lock. It matches ErrLocked with errors.Is. TryLockAll returns
// it wrapped with the set, naming the first name of the set (in Key order)
// that was held.
type HeldError struct {
	// Name is the lock's name; Key is Key(Name).
	Name string
	Key  int64
	// Holders are the sessions that held the key in a conflicting mode,
	// read in the same statement that failed to take it (one, or several
	// shared holders). It is empty if they let go in the meantime, or if
	// the holder is in another database (advisory locks are per
	// database, so it cannot be).
	Holders []Info
}

// Error names the lock and its holders: pid, application, client address
// and when their sessions last changed state.
func (e *HeldError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "pglock: lock %q held by ", e.Name)
	if len(e.Holders) == 0 {
		b.WriteString("another session")
		return b.String()
	}
	for i, h := range e.Holders {
		if i > 0 {
			b.WriteString(", ")
		}
		if i == 3 {
			fmt.Fprintf(&b, "and %d more", len(e.Holders)-i)
			break
		}
		b.WriteString(h.session())
	}
	return b.String()
}

// Is reports whether target is ErrLocked.
func (e *HeldError) Is(target error) bool { return target == ErrLocked }

// session describes who holds or awaits a lock, for messages:
// pid 4242 (application "billing", client 10.0.0.7, idle since 12:00:01Z),
// or prepared transaction "xa-1" (prepared 12:00:01Z).
func (i Info) session() string {
	if i.GID != "" {
		return fmt.Sprintf("prepared transaction %q (prepared %s)", i.GID, i.Prepared.UTC().Format(time.RFC3339))
	}
	client := i.ClientAddr
	if client == "" {
		client = "local"
	}
	s := fmt.Sprintf("pid %d (application %q, client %s", i.PID, i.ApplicationName, client)
	if !i.StateChange.IsZero() && i.State != "" {
		s += fmt.Sprintf(", %s since %s", i.State, i.StateChange.UTC().Format(time.RFC3339))
	}
	return s + ")"
}

// ctxFirst is err, of a statement that failed after ctx had ended, as
// ctx's error (err kept in the chain and the text): what the driver says
// then — a closed connection ("driver: bad connection" from
// database/sql), a lock timeout — is the consequence of ctx ending, and
// callers match ctx's error with errors.Is. While ctx lasts, err is
// prefixed with its hint (internal/pgerr): a role's statement_timeout or
// lock_timeout, say, ended the wait.
func ctxFirst(ctx context.Context, err error) error {
	cause := context.Cause(ctx)
	if cause == nil {
		return pgerr.WithHint(err)
	}
	if errors.Is(err, cause) {
		return err
	}
	return fmt.Errorf("%w (%w)", cause, err)
}
