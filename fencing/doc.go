// Package fencing makes stale lock holders harmless: PostgreSQL itself
// rejects writes to protected rows that carry an outdated fence.
package fencing
