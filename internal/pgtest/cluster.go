package pgtest

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// Cluster is a throwaway PostgreSQL cluster owned by one test; see
// pgcluster.Cluster for Stop, Kill, Start, URL and Port.
type Cluster = pgcluster.Cluster

// ClusterOption configures StartCluster.
type ClusterOption = pgcluster.Option

// WithSetting sets a server parameter (postgres -c name=value), for example
// WithSetting("idle_session_timeout", "1s").
func WithSetting(name, value string) ClusterOption { return pgcluster.WithSetting(name, value) }

// StartCluster initialises and starts a throwaway cluster that belongs to t
// and is stopped and removed when t ends. It fails t when no PostgreSQL
// binaries are found.
func StartCluster(t testing.TB, opts ...ClusterOption) *Cluster {
	t.Helper()
	c, err := pgcluster.New(opts...)
	if err != nil {
		t.Fatalf("pgtest: throwaway cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("pgtest: remove throwaway cluster: %v", err)
		}
	})
	return c
}
