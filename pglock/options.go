package pglock

import (
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/pgfence/pgfence/internal/dbx"
)

// Defaults and limits of the options.
const (
	DefaultLivenessInterval = 1 * time.Second
	DefaultLivenessTimeout  = 3 * time.Second
	DefaultUnlockTimeout    = 5 * time.Second

	MinLivenessInterval = 10 * time.Millisecond
	MaxLivenessInterval = time.Hour
	MinLivenessTimeout  = 10 * time.Millisecond
	MaxLivenessTimeout  = time.Hour
	MinUnlockTimeout    = 10 * time.Millisecond
	MaxUnlockTimeout    = time.Hour
)

// An Option configures a Locker. New applies them in order; an invalid one
// makes New return an error matching ErrInvalid that names the setting.
type Option func(*config) error

type config struct {
	log           *slog.Logger
	interval      time.Duration
	timeout       time.Duration
	unlockTimeout time.Duration
	meter         metric.MeterProvider // nil: otel.GetMeterProvider() at New
	nameAttr      bool
}

func defaultConfig() config {
	return config{
		log:           slog.New(slog.DiscardHandler),
		interval:      DefaultLivenessInterval,
		timeout:       DefaultLivenessTimeout,
		unlockTimeout: DefaultUnlockTimeout,
	}
}

// hooks are the package's test hooks, in one place; production code only
// reads them. Tests set them on a Locker right after New.
type hooks struct {
	// monitorDelay is how long after a grant the monitor starts watching
	// (default monitorStartDelay).
	monitorDelay time.Duration
	// noCancelRequest skips the cancel request of an abandoned wait, as
	// if it were lost on the network.
	noCancelRequest bool
	// watching, if set, is called by a Lock's monitor each time it is
	// about to block reading the socket.
	watching func(*Lock)
	// lateAnswer, if set, is called by abandon when the server's own
	// lock_timeout did not end a wait within answerWait, so that pglock
	// goes on to end it itself (and the session is destroyed).
	lateAnswer func()
}

// WithLogger sends the Locker's log records to l (see the package
// documentation's Logs section). Default: discard everything. A nil l is
// invalid.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalid("option WithLogger", "logger is nil")
		}
		c.log = l
		return nil
	}
}

// WithLivenessCheck sets how a held lock checks its session.
//
// Between checks the lock's connection is watched for the server closing
// it, so a terminated backend (pg_terminate_backend, server shutdown or
// crash) is noticed at once. After interval without any traffic, a one
// round-trip check runs with timeout; if it fails or does not answer in
// time, the lock is lost. A network that goes silent is therefore noticed
// within interval+timeout.
//
// Defaults: interval 1s, timeout 3s. Valid: interval in [10ms, 1h],
// timeout in [10ms, 1h]. A timeout shorter than the server's worst response
// time under load reports losses that did not happen (the connection is
// then destroyed, which really does release the lock).
func WithLivenessCheck(interval, timeout time.Duration) Option {
	return func(c *config) error {
		if interval < MinLivenessInterval || interval > MaxLivenessInterval {
			return invalid("option WithLivenessCheck", fmt.Sprintf("interval must be between %v and %v, got %v",
				MinLivenessInterval, MaxLivenessInterval, interval))
		}
		if timeout < MinLivenessTimeout || timeout > MaxLivenessTimeout {
			return invalid("option WithLivenessCheck", fmt.Sprintf("timeout must be between %v and %v, got %v",
				MinLivenessTimeout, MaxLivenessTimeout, timeout))
		}
		c.interval, c.timeout = interval, timeout
		return nil
	}
}

// WithUnlockTimeout bounds the clean-up pglock does after its caller is
// done: the Unlock that Do runs after fn (with context.WithoutCancel, so
// it runs even when ctx has ended), and the cancellation of a wait whose
// context ended (see Lock). Default 5s, valid [10ms, 1h]; the leases
// package's release timeout has the same default.
func WithUnlockTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < MinUnlockTimeout || d > MaxUnlockTimeout {
			return invalid("option WithUnlockTimeout", fmt.Sprintf("timeout must be between %v and %v, got %v",
				MinUnlockTimeout, MaxUnlockTimeout, d))
		}
		c.unlockTimeout = d
		return nil
	}
}

// WithMeterProvider sets the OpenTelemetry MeterProvider the Locker creates
// its instruments on (once, in New; see the package documentation's
// Metrics section). Default: the global provider, otel.GetMeterProvider(),
// which records nothing until the application installs one with
// otel.SetMeterProvider (instruments created before that are forwarded to
// it). A nil mp is invalid.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if dbx.IsNil(mp) { // a typed nil too: it would panic when called
			return invalid("option WithMeterProvider", "provider is nil")
		}
		c.meter = mp
		return nil
	}
}

// WithNameAttribute adds the lock's name as the attribute "name" to every
// measurement when on (a set of more than five names: its first five and
// how many more). Default off: each distinct name becomes a separate
// time series in the metrics backend, so turn it on only when the set of
// names is small and fixed (not names containing ids).
func WithNameAttribute(on bool) Option {
	return func(c *config) error {
		c.nameAttr = on
		return nil
	}
}
