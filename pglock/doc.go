// Package pglock provides session-scoped PostgreSQL advisory locks that never
// leak, and transaction-scoped ones for code already inside a transaction.
package pglock
