package pgtest

// NewCluster initialises and starts a throwaway cluster from the machine's
// PostgreSQL binaries, outside any test: `pgfence demo` uses it when no
// database is configured. The caller owns the cluster and must Close it;
// the postmaster also shuts down if the calling process dies (it is started
// with a parent-death signal).
//
// It returns an error when no PostgreSQL binaries are found (see the package
// documentation for where it looks) or when the server does not start.
func NewCluster(opts ...ClusterOption) (*Cluster, error) {
	return newCluster(opts...)
}

// Close stops the server immediately and removes its data directory. It is
// safe to call more than once.
func (c *Cluster) Close() error {
	return c.destroy()
}
