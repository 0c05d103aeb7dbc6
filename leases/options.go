package leases

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgfence/pgfence/internal/dbx"
)

// Limits and defaults.
const (
	// MinTTL is the shortest TTL a lease may have.
	MinTTL = time.Second
	// MaxNameLen is the longest lease name, in bytes (the grant functions'
	// check).
	MaxNameLen = 200
	// MaxOwnerLen is the longest owner prefix given to WithOwner, in bytes;
	// the per-grant suffix keeps the stored owner within 200 bytes.
	MaxOwnerLen = 100

	// DefaultPollInterval is the default for WithPollInterval.
	DefaultPollInterval = 2 * time.Second
	minPollInterval     = 10 * time.Millisecond
	maxPollInterval     = time.Hour

	// DefaultForceReleaseTimeout is the default for WithForceReleaseTimeout.
	DefaultForceReleaseTimeout = 5 * time.Second

	// DefaultReleaseTimeout is the default for WithReleaseTimeout, the
	// same as pglock's DefaultUnlockTimeout.
	DefaultReleaseTimeout = 5 * time.Second
	minReleaseTimeout     = 10 * time.Millisecond
	maxReleaseTimeout     = time.Hour
)

// Option configures a Client. An invalid option makes New return an error.
type Option func(*config) error

type config struct {
	owner        string
	log          *slog.Logger
	pollInterval time.Duration
	notify       bool
	meter        metric.MeterProvider // nil: otel.GetMeterProvider() at New
	tracer       trace.TracerProvider // nil: the global provider
	nameAttr     bool

	durableRelease bool
	forceTimeout   time.Duration
	releaseTimeout time.Duration
}

func defaultConfig() config {
	return config{
		owner:          defaultOwner(),
		log:            slog.New(slog.DiscardHandler),
		pollInterval:   DefaultPollInterval,
		notify:         true,
		forceTimeout:   DefaultForceReleaseTimeout,
		releaseTimeout: DefaultReleaseTimeout,
	}
}

// hooks are the package's test hooks, in one place; production code only
// reads them (and closes listening). Tests set them on a Client right
// after New, before its first grant.
type hooks struct {
	// noKeepalive simulates a frozen holder: no renewals, and no release
	// of the grants of leases lost at the local deadline.
	noKeepalive bool
	// onWait is called when a waiting acquirer is about to sleep (after a
	// failed attempt, or while its own client holds the lease).
	onWait func(name string)
	// listening is closed when LISTEN first succeeds.
	listening chan struct{}
	// listenSteady is listenSteady, shorter in tests.
	listenSteady time.Duration
	// lateProbes is how many of the listener's probes arrive too late:
	// it ignores their notifications (a loaded machine). Set before the
	// listener starts; only the listener touches it after that.
	lateProbes int
	// cancelRequest, if set, replaces the cancel request of a grant whose
	// caller gave up: returning nil without sending simulates a request
	// lost on the way (a proxy that drops it), an error one that could
	// not be sent.
	cancelRequest func(context.Context) error
	// wallSkew moves the wall clock that deadlines are checked by, as a
	// suspend of the system would; set under c.mu.
	wallSkew time.Duration
}

// WithDurableRelease makes releases wait for the WAL flush (and for
// synchronous standbys) as grants do. By default a release commits
// asynchronously: a release lost in a server crash delays the next holder
// until the grant's expiry — exactly as a crashed holder would — and never
// reorders fences, since releases draw none; the next durable commit (the
// next grant of any lease) makes it durable too. Turn it on when the next
// holder must be able to rely on a release surviving a crash or failover
// (for example, when a waiter's TTL-long delay after a failover would
// breach a deadline). Default false.
func WithDurableRelease(on bool) Option {
	return func(c *config) error {
		c.durableRelease = on
		return nil
	}
}

// WithForceReleaseTimeout bounds how long ForceRelease waits for a lease
// locked by a holder's open fenced transaction (default
// DefaultForceReleaseTimeout; from 1ms to 1h). A context deadline that is
// sooner wins.
func WithForceReleaseTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < time.Millisecond || d > time.Hour {
			return invalid(fmt.Sprintf("leases: force-release timeout must be between 1ms and 1h, got %s", d))
		}
		c.forceTimeout = d
		return nil
	}
}

// WithReleaseTimeout bounds the clean-up the client does after its caller
// is done: the Release that Run and Lead run after fn (with
// context.WithoutCancel, so it runs even when ctx has ended), the one
// statement with which Close ends every held grant, the release of a
// grant that arrived after Close began, and the keepalive's release of
// grants it stopped trusting; and the wait for the server's answer to a
// grant whose caller gave up (Acquire). A release that times out leaves
// the grant to expire after its TTL; in a batch, only the grants whose
// rows another transaction still locks. Default 5s, valid [10ms, 1h];
// pglock's WithUnlockTimeout has the same default.
func WithReleaseTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < minReleaseTimeout || d > maxReleaseTimeout {
			return invalid(fmt.Sprintf("leases: invalid option WithReleaseTimeout: timeout must be between %v and %v, got %v",
				minReleaseTimeout, maxReleaseTimeout, d))
		}
		c.releaseTimeout = d
		return nil
	}
}

// WithOwner sets the owner prefix that identifies this client in the lease
// table, in Get/List results and in HeldError. Every grant appends "-" and
// 16 hex digits from crypto/rand, so owners are unique per grant even when
// several clients share a prefix. Default: "<hostname>/<pid>". Valid: 1 to
// MaxOwnerLen bytes of UTF-8 without NUL.
func WithOwner(id string) Option {
	return func(c *config) error {
		if err := validateOwner(id); err != nil {
			return err
		}
		c.owner = id
		return nil
	}
}

// WithLogger sets where the client logs. Records: each grant and release
// at Debug ("leases: acquired", "leases: released"), a force-release at
// Info ("leases: force-released"), each loss at Warn ("leases: lease
// lost", with cause), and renewal retries and listener trouble at Warn.
// Default: discard. Must not be nil.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return invalid("leases: logger must not be nil")
		}
		c.log = l
		return nil
	}
}

// WithPollInterval sets how often a waiting acquirer or an observer checks
// the lease table when no notification arrives. Notifications make
// hand-over as fast as a round trip; polling is the fallback (e.g. behind a
// transaction-mode pooler where LISTEN does not work) and catches expiries.
// A waiter also wakes when the holder's grant expires by the database clock.
// Polls are jittered; without a working listener, or while another
// session holds the lease's wait key (docs/design.md), they back off from
// 50ms up to this interval. Default DefaultPollInterval (2s); valid 10ms
// to 1h.
func WithPollInterval(d time.Duration) Option {
	return func(c *config) error {
		if d < minPollInterval || d > maxPollInterval {
			return invalid(fmt.Sprintf("leases: poll interval must be between %s and %s, got %s", minPollInterval, maxPollInterval, d))
		}
		c.pollInterval = d
		return nil
	}
}

// WithNotifications turns the LISTEN/NOTIFY listener on or off. When on
// (the default), the client takes two dedicated connections from the pool
// and hijacks them, the first time something waits or observes; releases
// then wake waiters at once. Behind a transaction-mode pooler the client
// finds out by itself that notifications never arrive (a probe NOTIFY) and
// falls back to polling; turning the listener off there only saves its
// connections and the 2s probe. Releases still send notifications either
// way.
func WithNotifications(enabled bool) Option {
	return func(c *config) error {
		c.notify = enabled
		return nil
	}
}

// WithMeterProvider sets the OpenTelemetry MeterProvider the client creates
// its instruments on (once, in New; see the package documentation's
// Metrics section). Default: the global provider, otel.GetMeterProvider(),
// which records nothing until the application installs one with
// otel.SetMeterProvider (instruments created before that are forwarded to
// it). Must not be nil.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if dbx.IsNil(mp) { // a typed nil too: it would panic when called
			return invalid("leases: meter provider must not be nil")
		}
		c.meter = mp
		return nil
	}
}

// WithNameAttribute adds the lease's name as the attribute "name" to every
// measurement when on. Default off: each distinct name becomes a separate
// time series in the metrics backend, so turn it on only when the set of
// names is small and fixed (not names containing ids).
func WithNameAttribute(on bool) Option {
	return func(c *config) error {
		c.nameAttr = on
		return nil
	}
}

// defaultOwner is "<hostname>/<pid>", cut to MaxOwnerLen bytes.
func defaultOwner() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	pid := "/" + strconv.Itoa(os.Getpid())
	for len(host)+len(pid) > MaxOwnerLen || !utf8.ValidString(host) {
		_, size := utf8.DecodeLastRuneInString(host)
		host = host[:len(host)-size]
	}
	return host + pid
}
