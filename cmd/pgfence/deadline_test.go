package main

import (
	"testing"
	"time"
)

// Any grace that fits leaves room for two renewal attempts before SIGTERM
// is due, and the deadline comes at least the margin before expiry.
func TestTimingRule(t *testing.T) {
	t.Parallel()
	for _, ttl := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, time.Minute, time.Hour} {
		for _, grace := range []time.Duration{0, defaultGrace, maxGrace(ttl)} {
			if grace > maxGrace(ttl) {
				continue
			}
			every := renewEvery(ttl, grace)
			term := ttl - leaseMargin(ttl) - grace // after a renewal's start
			if every <= 0 || every > ttl/3 || 2*every >= term {
				t.Errorf("ttl %s grace %s: renewals every %s, SIGTERM %s after one", ttl, grace, every, term)
			}
			if leaseMargin(ttl) < ttl/10 {
				t.Errorf("ttl %s: margin %s under TTL/10", ttl, leaseMargin(ttl))
			}
		}
	}
	if got, want := renewEvery(5*time.Second, 2500*time.Millisecond), 666*time.Millisecond+666666; got != want {
		t.Errorf("renewEvery(5s, 2.5s) = %s, want %s", got, want)
	}
}

// The monotonic clock handed to the reaper runs with Go's own: its advance
// lies between the inner and outer brackets of Go's readings around it.
func TestMonoNow(t *testing.T) {
	t.Parallel()
	a0 := time.Now()
	m0 := monoNow()
	b0 := time.Now()
	time.Sleep(20 * time.Millisecond) // time to pass, not synchronisation
	a1 := time.Now()
	m1 := monoNow()
	b1 := time.Now()
	if d := time.Duration(m1 - m0); d < a1.Sub(b0) || d > b1.Sub(a0) {
		t.Errorf("CLOCK_MONOTONIC advanced %s, Go's clock between %s and %s", d, a1.Sub(b0), b1.Sub(a0))
	}
}
