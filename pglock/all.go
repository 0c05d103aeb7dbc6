package pglock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/dbx"
)

// Several names at once. A set of names is taken in one statement, key by
// key in ascending Key order, so that callers asking for overlapping sets
// in any order never wait for each other in a circle: whoever holds a key
// waits only for larger ones, and the holder of the largest awaited key
// waits for nobody. All or none: a blocking call that fails destroys its
// session (which releases what it took), a try gives back what it took
// before the refusal, and a transaction-scoped try rolls back to a
// savepoint (which releases transaction locks taken after it).

// A lockSet is what one acquire takes: its names, each once, ordered by
// key then name, and their distinct keys in ascending order, the order
// they are taken in. Two names may share a key: both are then held by it.
type lockSet struct {
	names   []string
	keys    []int64
	logName string // label cut after maxShownNames names: logs and metrics (label is Name())
}

// oneName is the set of the single, already validated, name.
func oneName(name string) lockSet {
	return lockSet{names: []string{name}, keys: []int64{Key(name)}, logName: name}
}

// newSet validates names and orders them into a set. An empty list and an
// invalid name are ErrInvalid; a name given twice counts once.
func newSet(names []string) (lockSet, error) { return newSetKeyed(names, Key) }

// newSetKeyed is newSet with key as the key function, so that tests can
// make names collide.
func newSetKeyed(names []string, key func(string) int64) (lockSet, error) {
	if len(names) == 0 {
		return lockSet{}, invalid("names", "none given")
	}
	type keyed struct {
		key  int64
		name string
	}
	ks := make([]keyed, len(names))
	for i, n := range names {
		if err := checkNameArg(fmt.Sprintf("names[%d]", i), n); err != nil {
			return lockSet{}, err
		}
		ks[i] = keyed{key(n), n}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return cmp.Or(cmp.Compare(a.key, b.key), strings.Compare(a.name, b.name)) })
	ks = slices.Compact(ks)
	s := lockSet{names: make([]string, len(ks))}
	for i, k := range ks {
		s.names[i] = k.name
		if i == 0 || k.key != ks[i-1].key {
			s.keys = append(s.keys, k.key)
		}
	}
	s.logName = strings.Join(s.names[:min(len(s.names), maxShownNames)], ", ")
	if n := len(s.names); n > maxShownNames {
		s.logName += fmt.Sprintf(", and %d more", n-maxShownNames)
	}
	return s, nil
}

// label is the set's names joined by ", ": Name().
func (s lockSet) label() string { return strings.Join(s.names, ", ") }

// nameOf returns the first name of the set whose key is key.
func (s lockSet) nameOf(key int64) string {
	for _, n := range s.names {
		if Key(n) == key {
			return n
		}
	}
	return s.label()
}

// opErr is an error of op on the set.
func (s lockSet) opErr(op string, err error) error {
	return &opError{op: op, names: s.names, err: err}
}

// checkSet validates the arguments every call taking a set shares.
func checkSet(ctx context.Context, names []string) (lockSet, error) {
	if ctx == nil {
		return lockSet{}, invalid("context", "is nil")
	}
	return newSet(names)
}

var (
	modeLockAll    = mode{op: "lock all"}
	modeTryLockAll = mode{op: "try lock all", try: true}
)

// LockAll takes the exclusive locks of all names, waiting while other
// sessions hold any of them, and returns one Lock holding them all on one
// session. The order of names does not matter, and a name given twice
// counts once: the locks are taken in ascending Key order, in one
// statement, so LockAll calls on overlapping sets never deadlock with each
// other, nor with Lock, RLock or the transaction-scoped calls (see the
// package documentation's Several names section for the one rule).
//
// All or none: if ctx ends or the statement fails part-way, the session,
// which may hold some of the names, gives them back before LockAll returns
// when the server refused the wait by itself (its lock_timeout, which
// carries ctx's deadline, a deadlock, a full lock table) or granted it as
// ctx's deadline passed, and is destroyed otherwise. ctx is honoured as in
// Lock. Unlock releases every name; the loss of the session loses every
// name (one Context for the set).
//
// An empty names, an invalid name, a nil ctx or a nil Locker return an
// error matching ErrInvalid before anything is taken.
func (l *Locker) LockAll(ctx context.Context, names ...string) (*Lock, error) {
	return l.acquireAll(ctx, names, modeLockAll)
}

// TryLockAll takes the exclusive locks of all names, as LockAll, if no
// other session holds any of them. Otherwise it returns at once an error
// wrapping a *HeldError (matching ErrLocked) that names the first name, in
// Key order, found held, and its holders; the names taken before it have
// been given back (or their session destroyed, if that failed). ctx bounds
// the call; on any failure no lock is held and no connection kept.
func (l *Locker) TryLockAll(ctx context.Context, names ...string) (*Lock, error) {
	return l.acquireAll(ctx, names, modeTryLockAll)
}

func (l *Locker) acquireAll(ctx context.Context, names []string, m mode) (*Lock, error) {
	if l == nil {
		return nil, invalid("locker", "is nil")
	}
	s, err := checkSet(ctx, names)
	if err != nil {
		return nil, err
	}
	return l.take(ctx, s, m)
}

// XactLockAll takes the exclusive transaction-scoped locks of all names on
// tx, waiting while other sessions hold any of them, in ascending Key order
// in one statement (see LockAll). They are released when tx ends. ctx
// bounds the wait; if it ends, or the statement fails, tx is aborted with
// some of the names possibly taken: roll it back. Bad input (empty names,
// an invalid name, nil ctx or tx) returns an error matching ErrInvalid
// before anything is sent.
func XactLockAll(ctx context.Context, tx pgx.Tx, names ...string) error {
	const op = "xact lock all"
	s, err := checkXactAll(ctx, tx, names, op)
	if err != nil {
		return err
	}
	tag, err := xactLock(ctx, tx, sqlXactLockAll, sqlXactLockAllUntil, s.keys)
	if err != nil {
		return s.opErr(op, err)
	}
	if tag.RowsAffected() == 0 {
		return s.opErr(op, ErrStandby)
	}
	return nil
}

// TryXactLockAll takes the exclusive transaction-scoped locks of all names
// on tx if no other session holds any of them, reporting whether it did.
// false with a nil error means another session holds one of them, and then
// tx holds none of the names it did not hold before: the names are tried
// inside a savepoint, and rolling back to it releases those taken. They
// are released when tx ends. On an error tx may be aborted: roll it back.
func TryXactLockAll(ctx context.Context, tx pgx.Tx, names ...string) (bool, error) {
	const op = "try xact lock all"
	s, err := checkXactAll(ctx, tx, names, op)
	if err != nil {
		return false, err
	}
	ok, err := tryXactLockAll(ctx, tx, s.keys)
	if err != nil {
		return false, s.opErr(op, err)
	}
	return ok, nil
}

// tryXactLockAll tries keys on tx, all or none; its error is the caller's
// to wrap.
func tryXactLockAll(ctx context.Context, tx pgx.Tx, keys []int64) (bool, error) {
	if len(keys) == 1 {
		return tryXactLock(ctx, tx, keys[0]) // nothing to undo: no savepoint
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("savepoint: %w", err)
	}
	var taken int32
	err = sp.QueryRow(ctx, sqlTryLockAll, keys, true).Scan(nil, &taken, nil)
	if err == nil && int(taken) == len(keys) {
		if err := sp.Commit(ctx); err != nil {
			return false, fmt.Errorf("release savepoint: %w", err)
		}
		return true, nil
	}
	// Not all, or failed: rolling back to the savepoint releases the
	// transaction locks taken after it.
	if rerr := sp.Rollback(ctx); rerr != nil && err == nil {
		err = fmt.Errorf("roll back to savepoint: %w", rerr)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		err = ErrStandby
	}
	return false, err
}

func checkXactAll(ctx context.Context, tx pgx.Tx, names []string, op string) (lockSet, error) {
	s, err := checkSet(ctx, names)
	if err != nil {
		return s, err
	}
	if dbx.IsNil(tx) {
		return s, invalid("transaction", "is nil")
	}
	if err := ctx.Err(); err != nil {
		return s, s.opErr(op, err)
	}
	return s, nil
}
