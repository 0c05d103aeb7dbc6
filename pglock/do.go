package pglock

import (
	"context"
	"errors"
	"fmt"
)

// Do takes the exclusive lock name (waiting, as Lock), runs fn with a
// context that ends when ctx ends or the lock is lost (whichever first;
// the cause says which: ErrLost for a loss), then unlocks, also when fn
// panics. The Unlock ignores ctx's cancellation and is bounded by the
// unlock timeout (WithUnlockTimeout).
//
// Do returns Lock's error, or fn's. If the lock was lost while fn ran,
// the error wraps ErrLost, also when fn returned nil: the critical
// section was not exclusive to its end. Any other Unlock failure is
// logged, not returned: the connection is then destroyed, which releases
// the lock. fn must stop its work when its context ends. Do mirrors
// leases.Client.Run.
func (l *Locker) Do(ctx context.Context, name string, fn func(ctx context.Context, lk *Lock) error) (err error) {
	if l == nil {
		return invalid("locker", "is nil")
	}
	if fn == nil {
		return invalid("callback", "fn is nil")
	}
	lk, err := l.Lock(ctx, name)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(lk.ctx, func() { cancel(context.Cause(lk.ctx)) })
	defer func() {
		stop()
		cancel(nil)
		uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.unlockTimeout)
		defer ucancel()
		err = unlockAfter(l, lk, lk.Unlock(uctx), err)
	}()
	return fn(fnCtx, lk)
}

// unlockAfter combines fn's error with the Unlock that followed it.
func unlockAfter(l *Locker, lk *Lock, unlockErr, fnErr error) error {
	switch {
	case unlockErr == nil:
		return fnErr
	case errors.Is(unlockErr, ErrLost):
		if fnErr == nil {
			return unlockErr
		}
		if errors.Is(fnErr, ErrLost) {
			return fnErr
		}
		return fmt.Errorf("%w (and %w)", fnErr, unlockErr)
	}
	l.tel.unlockFailed(lk, unlockErr)
	return fnErr
}
