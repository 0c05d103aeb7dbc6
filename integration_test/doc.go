// Package integration holds pgfence's multi-process and fault-injection
// tests (in its _test.go files): real OS processes and a real PostgreSQL,
// attacked with pauses, kills, killed backends, partitions and restarts.
// It exports nothing.
//
// # Scaffolding
//
//   - Worker processes (worker_test.go, roles_test.go): the test binary run
//     again with -test.run=^TestHelperWorker$ and a JSON configuration in
//     the environment. A worker reports JSON events, one per line, on
//     stdout, takes commands on stdin, and exits when stdin closes; its own
//     TestMain checks it for goroutine leaks. Tests await its events rather
//     than sleeping.
//   - A TCP proxy (proxy_test.go) between a client and the server that can
//     blackhole (stop forwarding, keep sockets open) and cut (close all).
//   - A server factory (servers_test.go) for tests that stop and start
//     PostgreSQL: testcontainers-go's postgres module when a Docker engine
//     answers, a throwaway cluster from local binaries otherwise.
//   - A porcupine model of lease grants, renewals, releases and fenced
//     writes (linear_test.go, linearizability_test.go).
//
// # Scenarios
//
// TestExactlyOnce, TestPause, TestCrash, TestKilledBackend, TestPartition,
// TestRestart, TestLinearizability and TestHostileInput each prove one
// group of the guarantees in the design; their doc comments say which.
// TestFailoverSync and TestFailoverAsyncLostTail run a primary and a
// streaming standby, kill the primary and promote the standby, and check
// fence order, holders' loss reports and stale-write rejection across it
// (and that the raw sequence alone would reissue an acknowledged fence).
// TestDoublePromotion promotes two standbys of one primary in turn, the
// second never having seen the first's timeline, and checks that fences do
// not repeat. The Patroni scenarios (patroni_*_test.go, Linux and root
// only) run etcd, three Patroni nodes in network namespaces and HAProxy
// (internal/pgcluster.NewPatroni), put them under load, inject a
// switchover, a kill of PostgreSQL or of a whole node, or a partition of the
// primary, and check fences, loss reports, linearizability and, with
// synchronous_mode, that no acknowledged write is lost; docs/patroni.md
// gives what they measured.
// Every test checks at cleanup that no advisory lock is left in its
// database and that its pools have no connection acquired.
//
// Run them with
//
//	go test -race -count=1 ./integration_test/
package integration
