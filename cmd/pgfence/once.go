package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/pflag"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/names"
	"github.com/pgfence/pgfence/leases"
)

// pgfence run's once per period (--once KEY) and minimum hold (--at-least
// D), for run.go to call: addOnceFlags when it builds its flags,
// validate with its options, skip right after the lease is granted (do
// not run the command when the period is done), hold before the release,
// and record after the command exited 0 (before the release).

var onceHelp = `--once KEY runs the command only if period KEY of the lease is not done
yet, and records it done (in pgfence.once, under the lease's fence) when
the command exits 0; a replica that finds it done exits 0 without running
the command. A command that fails, a pgfence that dies before the record,
or a record the database does not answer within ` + answerTimeout.String() + ` (pgfence then exits 1)
leaves the period to the next run. --at-least D keeps the lease until D
after it was granted (database clock), however fast the command is, so a
replica whose clock fires late cannot run it again within the same tick.`

// onceOptions are run's --once and --at-least.
type onceOptions struct {
	key     string
	atLeast time.Duration
}

// addOnceFlags registers --once and --at-least on fs.
func addOnceFlags(fs *pflag.FlagSet, o *onceOptions) {
	fs.StringVar(&o.key, "once", "", "with --lease: run at most once for period `KEY` (e.g. a date), recording it when the command exits 0")
	fs.DurationVar(&o.atLeast, "at-least", 0, "with --lease: keep the lease at least `D` after it was granted, however fast the command is")
}

// validate checks the flags against run's --lease (empty with --lock).
func (o onceOptions) validate(lease string) error {
	switch {
	case lease == "" && (o.key != "" || o.atLeast != 0):
		return errors.New("--once and --at-least need --lease")
	case o.atLeast < 0 || o.atLeast > 24*time.Hour:
		return fmt.Errorf("--at-least must be between 0 and 24h, got %s", o.atLeast)
	case o.key != "":
		if err := names.Check(o.key, leases.MaxPeriodLen); err != nil {
			return fmt.Errorf("--once key %w", err)
		}
	}
	return nil
}

// skip reports whether the command must not run: --once and its period
// is done. Call it with the lease held (every earlier holder's record has
// committed then).
func (o onceOptions) skip(ctx context.Context, lc *leases.Client, l *leases.Lease) (bool, error) {
	if o.key == "" {
		return false, nil
	}
	_, done, err := lc.OnceDone(ctx, l.Name(), o.key)
	return done, err
}

// hold applies --at-least to l; call it before the release.
func (o onceOptions) hold(l *leases.Lease) error {
	return l.HoldAtLeast(o.atLeast)
}

// record records --once's period done under l's fence; call it after the
// command exited 0, before the release. A lease lost meanwhile makes it
// fail (fencing.ErrStale): the period is then not done.
func (o onceOptions) record(ctx context.Context, pool *pgxpool.Pool, l *leases.Lease) error {
	if o.key == "" {
		return nil
	}
	return fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
		_, err := leases.MarkDone(ctx, tx, l.Name(), o.key)
		return err
	})
}
