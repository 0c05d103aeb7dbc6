// Package pgfencetest gives the integration tests of programs that use
// pgfence a real, migrated PostgreSQL in one call, and the means to fault
// the holder of a lease the way production will: freeze it, cut its
// network.
//
// It is a module of its own (github.com/pgfence/pgfence/pgfencetest), so
// that testcontainers-go and the Docker client stay out of the module graph
// of programs that only use pgfence.
//
// # A database for each test
//
// URL and Pool give a test its own database, cloned from a template with
// pgfence's migrations applied, and drop it when the test ends. The server
// behind them is provisioned once per test binary, the first of these that
// works:
//
//  1. PGFENCE_TEST_DATABASE_URL, if set: an existing server whose role may
//     CREATE DATABASE. Nothing is started. (Set explicitly, it wins.) What
//     stays on it: the migrated template (a database named pgfence_tpl_
//     and a hash of the migrations and the role, which the role's later
//     runs reuse) and, where the role may create them, the roles
//     pgfence_client and pgfence_operator, which the migrations create for
//     the whole cluster.
//  2. A container, started through the Docker Engine API, when a Docker
//     engine answers; the image is PGFENCE_POSTGRES_IMAGE, default
//     postgres:17-alpine.
//  3. A throwaway cluster from PostgreSQL's binaries on the machine (initdb
//     and postgres on PATH or under /usr/lib/postgresql/*/bin).
//
// PGFENCE_TEST_PROVISIONER=url, container or local forces one. When
// none works the test fails, saying how to provide one; it never skips.
// Call Main from TestMain: it stops what was started when the tests end.
//
// # Faults
//
// PauseProcess and PauseContainer freeze a lease holder (SIGSTOP, or the
// container's cgroup freezer) as a long GC pause or a stalled VM would, so
// that its lease expires under it; the returned function resumes it.
// NewProxy puts a loopback TCP proxy between a process and PostgreSQL whose
// Cut drops its connections and refuses new ones (a partition) until
// Restore (it dials the server within 10s of each connection, and closes
// the connection when that fails); CutContainerNetwork disconnects a
// container from its networks.
// Everything is undone when the test ends, also when it fails.
package pgfencetest
