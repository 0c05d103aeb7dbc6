//go:build linux

package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/migrations"
)

// patroniSlot lets one Patroni cluster run at a time: each is etcd, three
// Patroni processes and three PostgreSQL servers on a machine the other
// tests share, and failover timing needs the CPU.
var patroniSlot = make(chan struct{}, 1)

// startPatroni starts a Patroni cluster (internal/pgcluster.NewPatroni),
// applies pgfence's migrations through its multi-host URL and tears it
// down at the end of the test — printing every node's log if the test
// failed.
func startPatroni(t *testing.T, opts ...pgcluster.PatroniOption) *pgcluster.Patroni {
	t.Helper()
	patroniSlot <- struct{}{}
	t.Cleanup(func() { <-patroniSlot })
	start := time.Now()
	p, err := pgcluster.NewPatroni(opts...)
	if err != nil {
		t.Fatalf("start the Patroni cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Patroni cluster logs:\n%s", p.Logs(6000))
		}
		if err := p.Close(); err != nil {
			t.Errorf("remove the Patroni cluster: %v", err)
		}
	})
	t.Logf("Patroni cluster (etcd, %d nodes, HAProxy) healthy after %v", len(p.Nodes()), time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, p.URL("postgres")); err != nil {
		t.Fatalf("migrate the Patroni cluster: %v", err)
	}
	return p
}
