// Package leases provides leases with database-clock expiry and fences:
// for long jobs, leader election and cron on many replicas.
package leases
