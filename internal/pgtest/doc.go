// Package pgtest provisions real PostgreSQL databases for pgfence's tests.
// There are no mocks: anything whose behaviour is PostgreSQL's is tested
// against PostgreSQL.
//
// # Where the server comes from
//
// The first test that asks for a database provisions a server for the test
// process, trying in this order:
//
//  1. PGFENCE_TEST_DATABASE_URL, if set: an existing server (the role needs
//     CREATEDB). Nothing is started.
//  2. A PostgreSQL container, when a Docker engine answers, with the image
//     PGFENCE_POSTGRES_IMAGE names (default postgres:17-alpine;
//     docker/build-images.sh builds a stand-in where no registry can be
//     reached), started through the Docker Engine API with the standard
//     library: testcontainers-go would put the Docker client into the module
//     graph of every program importing pgfence. Main removes the container.
//     (The pgfencetest module, for users' tests, uses testcontainers-go.)
//  3. A throwaway cluster from PostgreSQL binaries on the machine (initdb and
//     postgres on PATH or under /usr/lib/postgresql/*/bin), in a temporary
//     directory, on a free loopback port. When the tests run as root, the
//     cluster runs as the unprivileged "postgres" user (or "nobody").
//  4. Otherwise every test that needs a database fails with a message saying
//     how to provide one. Tests never skip silently.
//
// PGFENCE_TEST_PROVISIONER=url, container or local forces one of them:
// it must work, or the tests fail. Main prints, for each test binary, which
// one served it ("pgtest: leases: PostgreSQL from a container (…)").
//
// # Isolation
//
// Each test gets its own database, cloned (CREATE DATABASE … TEMPLATE) from a
// template that has pgfence's migrations applied. The template's name carries
// a hash of the migration files and of the role that applied them, so test
// processes of several packages share it safely, a changed migration gets a
// new one, and so does each role on a server that several share. Tests and
// packages can therefore run in parallel without seeing each other's rows,
// leases or protected tables. Advisory locks are per database too (their lock tag
// includes the database OID).
//
// # Throwaway clusters
//
// StartCluster starts a cluster owned by one test, which the test may stop
// (smart, fast, immediate), kill, and start again: fault-injection tests use
// it, never the shared server.
//
// # Roles
//
// LoginRole creates a login role with a random name and password (a server
// of one's own may ask for passwords) and drops it, with the databases and
// objects it owns, when the test ends: a role is the cluster's, so one left
// behind outlives the test and its database.
//
// # PgBouncer
//
// StartPgBouncer puts a real PgBouncer (session or transaction pooling) in
// front of a test server for the deployment tests; it fails the test, with
// the install hint, when pgbouncer is missing.
//
// # Leaks
//
// Main, called from a package's TestMain, runs the tests, stops whatever the
// process provisioned, and fails the run if goroutines leaked (goleak).
package pgtest
