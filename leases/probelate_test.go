package leases

import (
	"testing"
	"time"
)

// A probe notification that comes too late once — a loaded machine, not a
// pooler that never forwards it — must not switch notifications off for
// the client's life: the listener tries again, and listens. Two in a row
// late as well; behind a pooler none arrives and the listener gives up
// after probeAttempts (integration_test's PgBouncer tests).
func TestLateProbeIsRetried(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	c.hooks.lateProbes = probeAttempts - 1
	start := time.Now()
	c.startListener()
	select {
	case <-c.hooks.listening:
		t.Logf("listening after %d late probes, %s", probeAttempts-1, time.Since(start).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatalf("the listener did not listen within a minute after %d late probes", probeAttempts-1)
	}
}
