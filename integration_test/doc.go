// Package integration_test attacks pgfence's guarantees with real OS
// processes and a real PostgreSQL: pauses, kills, killed backends,
// partitions and restarts.
package integration_test
