package leases

import (
	"fmt"
	"time"
)

// A minimum hold keeps a released grant in place until acquired_at + d by
// the database clock (pgfence.release_at_least, migration 6).

// releaseAtLeastSQL is the release statement that honours a minimum hold.
func (c *Client) releaseAtLeastSQL() string {
	if c.cfg.durableRelease {
		return sqlReleaseAtLeastDurable
	}
	return sqlReleaseAtLeast
}

// HoldAtLeast sets a minimum hold (ShedLock's lockAtLeastFor): Release
// leaves the grant in place until its acquired_at + d by the database
// clock, unrenewed, so that nobody can take the lease sooner — a job that
// finishes fast on a replica whose clock is ahead cannot run again on one
// whose clock is behind within the same tick. The Lease itself still ends
// at Release (Context, Done); only the row outlives it. Release then waits
// for a renewal of the grant already on its way, which would otherwise
// land after it and move the expiry. 0 (the default) turns it off. Close
// and a lost lease ignore it. d must be between 0 and 24h; it can be set,
// and changed, any time before Release.
func (l *Lease) HoldAtLeast(d time.Duration) error {
	if l == nil {
		return invalid("leases: minimum hold: lease must not be nil")
	}
	if d < 0 || d > maxHold {
		return invalid(fmt.Sprintf("leases: minimum hold must be between 0 and %s, got %s", maxHold, d))
	}
	l.c.mu.Lock()
	l.minHold = d
	l.c.mu.Unlock()
	return nil
}

// maxHold bounds HoldAtLeast.
const maxHold = 24 * time.Hour
