package pglock

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// Defaults and limits of the liveness check (see WithLivenessCheck).
const (
	DefaultLivenessInterval = 1 * time.Second
	DefaultLivenessTimeout  = 3 * time.Second

	MinLivenessInterval = 10 * time.Millisecond
	MaxLivenessInterval = time.Hour
	MinLivenessTimeout  = 10 * time.Millisecond
	MaxLivenessTimeout  = time.Hour
)

// An Option configures a Locker. Options are applied in order by New; an
// invalid one does not panic and is not ignored: the Locker returns its
// error from every call (New's signature has no error, by the v1 contract).
type Option func(*config) error

type config struct {
	log      *slog.Logger
	interval time.Duration
	timeout  time.Duration
	meter    metric.MeterProvider // nil: otel.GetMeterProvider() at New
	nameAttr bool
}

func defaultConfig() config {
	return config{
		log:      slog.New(slog.DiscardHandler),
		interval: DefaultLivenessInterval,
		timeout:  DefaultLivenessTimeout,
	}
}

// WithLogger sends the Locker's log records to l: a Warn when a held lock is
// lost ("pglock: lock lost"), Debug records for each grant ("pglock: lock
// acquired"), each Unlock ("pglock: lock released") and each connection
// destroyed because its lock state is in doubt. The default discards
// everything. A nil l is invalid.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("pglock: WithLogger: logger is nil")
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
			return fmt.Errorf("pglock: WithLivenessCheck: interval must be between %v and %v, got %v",
				MinLivenessInterval, MaxLivenessInterval, interval)
		}
		if timeout < MinLivenessTimeout || timeout > MaxLivenessTimeout {
			return fmt.Errorf("pglock: WithLivenessCheck: timeout must be between %v and %v, got %v",
				MinLivenessTimeout, MaxLivenessTimeout, timeout)
		}
		c.interval, c.timeout = interval, timeout
		return nil
	}
}

// WithMeterProvider sets the OpenTelemetry MeterProvider the Locker creates
// its instruments on (once, in New; see the package documentation's Metrics
// section). Default: the global provider, otel.GetMeterProvider(), which
// records nothing until the application installs one with
// otel.SetMeterProvider (instruments created before that are forwarded to
// it). A nil mp is invalid.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return errors.New("pglock: WithMeterProvider: provider is nil")
		}
		c.meter = mp
		return nil
	}
}

// WithNameAttribute adds the lock's name as the attribute "name" to every
// measurement when on. Default off: each distinct name becomes a separate
// time series in the metrics backend, so turn it on only when the set of
// names is small and fixed (not names containing ids).
func WithNameAttribute(on bool) Option {
	return func(c *config) error {
		c.nameAttr = on
		return nil
	}
}
