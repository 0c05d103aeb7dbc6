package leases

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/dbx"
)

// Once per period: a job (a lease name, "billing/nightly") runs at most
// once per period key ("2026-12-01") across every replica, and the fact
// that a period is done is a row of pgfence.once written by
// pgfence.mark_done (migration 6) under the lease's fence:
//
//   - Every replica calls Once (or OnceTx) for the period. All but one
//     wait for the lease; the holder checks the record, runs fn if the
//     period is not done, records it and releases; each waiter then takes
//     the lease, finds the record and returns without running fn.
//   - The record is written in a fenced transaction (pgfence.token_fence
//     checks the token and holds the lease's fence lock until commit): only
//     the current, unexpired grant can record, a stalled former holder's
//     record is rejected (fencing.ErrStale), and a later grant of the lease
//     commits only after the record has, so whoever holds the lease sees
//     every record that will ever be made by an earlier holder.
//   - A crash, a lost lease or an error before the record commits leaves
//     the period not done: the next holder runs it.
//
// OnceTx runs fn inside that same transaction, so effects in the same
// database and the record commit together or not at all: exactly once.
// Once runs fn outside any transaction (effects elsewhere, jobs longer
// than the TTL) and records afterwards: a crash between the effect and the
// record makes the next holder run the period again, so external effects
// must be idempotent or carry the fence (Lease.Token) to a system that
// rejects stale ones.

// MaxPeriodLen is the longest period key, in bytes.
const MaxPeriodLen = 200

// errAlreadyDone rolls back OnceTx's transaction when the period turns out
// to be recorded already.
var errAlreadyDone = errors.New("leases: period already done")

// OnceOption configures Once and OnceTx.
type OnceOption func(*onceConfig) error

type onceConfig struct {
	atLeast time.Duration
}

// AtLeast sets a minimum hold for the grant under which the period runs
// (Lease.HoldAtLeast): the lease stays taken until acquired_at + d by the
// database clock, however fast fn is. Default 0 (off); valid 0 to 24h.
func AtLeast(d time.Duration) OnceOption {
	return func(c *onceConfig) error {
		if d < 0 || d > maxHold {
			return invalid(fmt.Sprintf("leases: minimum hold must be between 0 and %s, got %s", maxHold, d))
		}
		c.atLeast = d
		return nil
	}
}

// OnceRecord is the record of a period done.
type OnceRecord struct {
	Name   string    // the job's lease name
	Period string    // the period key
	Fence  int64     // the fence of the grant that recorded it
	DoneAt time.Time // database clock
}

// Once runs fn at most once for period of the job name across all clients
// of the database: it returns (true, nil) when this call ran fn and
// recorded the period, (false, nil) when the period was done already (or
// was done by another replica while this call waited for the lease), and
// (false, err) when fn or the database failed — the period is then not
// done, and the next caller runs it; if the client closes before the
// period is recorded, err wraps ErrClosed (and fn's or the record's error,
// if any). fn runs under the lease name (ttl)
// with a context that ends when ctx ends or the lease is lost; after fn
// returns nil, Once records the period in a fenced transaction, under ctx:
// a hand-over request, which ends fn's context while the lease is still
// held, does not stop the record of work fn completed. If the
// lease was lost before the record committed, Once takes the lease again
// and, unless someone else recorded the period meanwhile, runs fn again:
// fn's effects must tolerate a repeat (see the package documentation), or
// use OnceTx. ctx bounds the whole call, waiting included.
func (c *Client) Once(ctx context.Context, name, period string, ttl time.Duration,
	fn func(ctx context.Context, l *Lease) error, opts ...OnceOption) (bool, error) {
	if fn == nil {
		return false, invalid("leases: fn must not be nil")
	}
	return c.once(ctx, name, period, ttl, opts, func(fctx context.Context, l *Lease, cfg onceConfig) (bool, error) {
		// Under the lease, every earlier holder's record has committed.
		if _, done, err := c.OnceDone(fctx, name, period); err != nil || done {
			return false, err
		}
		if err := l.HoldAtLeast(cfg.atLeast); err != nil {
			return false, err
		}
		if err := fn(fctx, l); err != nil {
			return false, err
		}
		// Recorded under ctx, not fn's context, which a hand-over request
		// ends while the lease is still held: fn did the period's work, and
		// not recording it would have the next holder do it again. The
		// fenced transaction refuses the record if the lease was lost.
		// Under REPEATABLE READ or SERIALIZABLE (a role's default) the
		// lease's own renewal fails the record with 40001: run it again.
		var recorded bool
		err := c.serially(ctx, func() error {
			if c.pool != nil {
				return fencing.InTx(ctx, c.pool, l.Token(), func(tx pgx.Tx) error {
					var err error
					recorded, err = MarkDone(ctx, tx, name, period)
					return err
				}, c.fenced...)
			}
			return fencing.InDBTx(ctx, c.sdb, l.Token(), func(tx *sql.Tx) error {
				var err error
				recorded, err = markDone(ctx, dbx.SQL(tx), name, period)
				return err
			}, c.fenced...)
		})
		if err != nil {
			return false, recordError{within(fmt.Sprintf("once %q: record period %q", name, period), err)}
		}
		return recorded, nil
	})
}

// OnceTx runs fn at most once for period of the job name across all
// clients, inside a fenced transaction (fencing.InTx with the lease's
// token) that also records the period: fn's writes to the same database
// and the record commit together or not at all, so the period's effects
// there happen exactly once. Results are Once's. tx is the transaction;
// fn must not commit or roll it back. The transaction holds the lease's
// fence lock until it ends, which renewals do not wait for: under READ
// COMMITTED the lease stays renewed and fn may outlast the TTL. Under
// REPEATABLE READ or SERIALIZABLE the transaction also share-locks the
// lease row, which renewals cannot update: there fn must finish well within
// the TTL (less the safety margin, TTL/10), or the lease is lost and the
// transaction rolled back. Either way no other replica can take the lease
// over while the transaction is open. Under those levels a serialization
// failure of the record, before fn runs (the lease's own renewal can cause
// one), runs the transaction again; one of fn's statements or of the
// commit is returned. If the lease is lost before the commit, OnceTx takes
// the lease again and tries again, unless another replica recorded the
// period meanwhile.
func (c *Client) OnceTx(ctx context.Context, name, period string, ttl time.Duration,
	fn func(ctx context.Context, tx pgx.Tx, l *Lease) error, opts ...OnceOption) (bool, error) {
	if fn == nil {
		return false, invalid("leases: fn must not be nil")
	}
	if c != nil && c.pool == nil {
		return false, invalid("leases: OnceTx needs a pgx pool (New); over database/sql use Once, or fencing.InDBTx")
	}
	return c.once(ctx, name, period, ttl, opts, func(ctx context.Context, l *Lease, cfg onceConfig) (bool, error) {
		var (
			fnErr  error
			called bool
			err    error
		)
		// Under REPEATABLE READ or SERIALIZABLE (a role's default) the
		// lease's own renewal, committed after the transaction's snapshot
		// and before the record share-locks the lease row, fails the
		// record with 40001: run the transaction again, as Once's record
		// is. Not once fn has run: its transaction's outcome is fn's.
		_ = c.serially(ctx, func() error {
			err = fencing.InTx(ctx, c.pool, l.Token(), func(tx pgx.Tx) error {
				recorded, err := MarkDone(ctx, tx, name, period)
				switch {
				case err != nil:
					return err
				case !recorded:
					return errAlreadyDone
				}
				if err := l.HoldAtLeast(cfg.atLeast); err != nil {
					return err
				}
				called = true
				fnErr = fn(ctx, tx, l)
				return fnErr
			}, c.fenced...)
			if called {
				return nil
			}
			return err
		})
		switch {
		case errors.Is(err, errAlreadyDone):
			return false, nil
		case err != nil && fnErr == nil: // the fenced transaction's, not fn's
			return false, recordError{within(fmt.Sprintf("once %q: period %q", name, period), err)}
		}
		return err == nil, err
	})
}

// once validates, skips a period already done, and runs body under the
// lease until body reports the period done by it or by someone else,
// fails, or ctx ends. A lost lease, or the record refused for a stale
// token, means nothing was recorded by this grant: it takes the lease
// again.
func (c *Client) once(ctx context.Context, name, period string, ttl time.Duration, opts []OnceOption,
	body func(ctx context.Context, l *Lease, cfg onceConfig) (bool, error)) (bool, error) {
	if err := validate(name, ttl); err != nil {
		return false, err
	}
	if err := validatePeriod(period); err != nil {
		return false, err
	}
	if err := c.usable(ctx); err != nil {
		return false, err
	}
	if err := c.checkEncoding(ctx, "once", name, period); err != nil {
		return false, err
	}
	var cfg onceConfig
	for _, opt := range opts {
		if opt == nil {
			return false, invalid("leases: once option must not be nil")
		}
		if err := opt(&cfg); err != nil {
			return false, err
		}
	}
	if _, done, err := c.OnceDone(ctx, name, period); err != nil || done {
		return false, err
	}
	for {
		l, err := c.Acquire(ctx, name, ttl)
		if err != nil {
			return false, err
		}
		var ran bool
		lost, err := c.runHeldLost(ctx, l, func(ctx context.Context, l *Lease) error {
			var err error
			ran, err = body(ctx, l, cfg)
			return err
		})
		switch {
		case ran:
			// Recorded under this grant, which was live until then (a
			// grant never comes back once expired): whatever happened to
			// the lease afterwards does not matter.
			return true, nil
		case err == nil:
			return false, nil
		case errors.Is(l.Err(), ErrClosed) && !errors.Is(err, ErrClosed):
			// Close ended the hold before the period was recorded: say
			// so, as every method of a closed Client does, rather than
			// with what fn or the record made of their context ending.
			return false, fmt.Errorf("leases: once %q period %q: %w (%w)", name, period, ErrClosed, err)
		case ctx.Err() == nil && (lost || staleRecord(err)):
			// This grant lost, not fn failing with another lease's ErrLost
			// or stale token.
			c.log.Warn("leases: lease lost before the period was recorded; trying again", "name", name, "period", period, "fence", l.Fence(), "err", err)
			continue
		}
		return false, err
	}
}

// recordError is an error of the transaction that records the period
// (Once's record, OnceTx's transaction), not of fn.
type recordError struct{ err error }

func (e recordError) Error() string { return e.err.Error() }
func (e recordError) Unwrap() error { return e.err }

// staleRecord reports whether err is the record's transaction rejected
// for a stale token: this grant was taken over, even if its release could
// not tell (a database error). fn's own stale errors (of another lease's
// fenced transaction) do not count; when this grant's are, its release
// finds it gone.
func staleRecord(err error) bool {
	var re recordError
	return errors.As(err, &re) && fencing.IsStale(re.err)
}

// OnceDone returns the record of period of the job name, and whether there
// is one. ctx bounds the query. After Close it returns ErrClosed.
func (c *Client) OnceDone(ctx context.Context, name, period string) (OnceRecord, bool, error) {
	if err := validateName(name); err != nil {
		return OnceRecord{}, false, err
	}
	if err := validatePeriod(period); err != nil {
		return OnceRecord{}, false, err
	}
	if err := c.usable(ctx); err != nil {
		return OnceRecord{}, false, err
	}
	if err := c.checkEncoding(ctx, "once record of", name, period); err != nil {
		return OnceRecord{}, false, err
	}
	rec := OnceRecord{Name: name, Period: period}
	err := c.q.QueryRow(ctx, sqlOnceDone, name, period).Scan(&rec.Fence, &rec.DoneAt)
	switch {
	case errors.Is(err, errNoRows):
		return OnceRecord{Name: name, Period: period}, false, nil
	case err != nil:
		return OnceRecord{Name: name, Period: period}, false, dbError(fmt.Sprintf("once %q period %q", name, period), err)
	}
	return rec, true, nil
}

// MarkDone records, in tx, that period of the job name is done. tx must
// be a fenced transaction (fencing.Begin or fencing.InTx) declaring the
// token of the lease name's current grant: a stale token fails with the
// guard's error (fencing.IsStale), and a token of another lease with
// fencing.IsNoToken. It returns true when it recorded the period and false
// when the period was recorded before (roll tx back then, if it did the
// period's work). The record commits with tx. For callers that hold the
// lease themselves (pgfence run --once); Once and OnceTx call it for you.
// A name or period that is not ASCII costs one more statement in tx, which
// reads client_encoding: unless it is UTF8, MarkDone refuses them
// (ErrInvalid), as the Client's methods do.
func MarkDone(ctx context.Context, tx pgx.Tx, name, period string) (bool, error) {
	if ctx == nil || dbx.IsNil(tx) {
		return false, invalid("leases: mark done: context and transaction must not be nil")
	}
	if err := validateName(name); err != nil {
		return false, err
	}
	if err := validatePeriod(period); err != nil {
		return false, err
	}
	if err := checkTxEncoding(ctx, tx, "mark done", name, period); err != nil {
		return false, err
	}
	return markDone(ctx, tx, name, period)
}

// markDone is MarkDone on any transaction, pgx's or database/sql's.
func markDone(ctx context.Context, tx dbx.Querier, name, period string) (bool, error) {
	var recorded bool
	if err := tx.QueryRow(ctx, sqlMarkDone, name, period).Scan(&recorded); err != nil {
		return false, dbError(fmt.Sprintf("mark period %q of %q done", period, name), err)
	}
	return recorded, nil
}

func validatePeriod(period string) error {
	return validateText("period", period, MaxPeriodLen)
}
