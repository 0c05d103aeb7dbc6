// Package integration holds pgfence's multi-process and fault-injection
// tests (in its _test.go files): real OS processes and a real PostgreSQL,
// attacked with pauses, kills, killed backends, partitions and restarts.
// It exports nothing.
package integration
