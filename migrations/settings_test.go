package migrations_test

import (
	"context"
	"hash/crc32"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// TestUpDownUnderOddSessionSettings: an operator's role or database may
// set standard_conforming_strings off (backslashes in '...' are then
// escapes) and date, interval and number output styles other than the
// defaults. Every migration applies and reverts all the same: migration
// 4's DO blocks held the literal '\x00', which such a session read as a
// NUL character ("invalid byte sequence for encoding "UTF8": 0x00").
func TestUpDownUnderOddSessionSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.WithSettings(pgtest.EmptyURL(t), "standard_conforming_strings=off", "DateStyle=SQL,DMY", "IntervalStyle=sql_standard",
		"TimeZone=Pacific/Chatham", "extra_float_digits=-15", "bytea_output=escape")
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up: %v", err)
	}
	if err := migrations.Down(ctx, u); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if err := migrations.Up(ctx, u); err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
}

// TestUpWaitsPastTheRolesTimeouts: a role or database may set
// statement_timeout (ALTER ROLE app SET statement_timeout = '2s') or, on
// PostgreSQL 17, transaction_timeout. Up waits for the migration lock
// while another migrator holds it, for as long as ctx allows, and a
// migration's file runs to its end (migration 9 waits up to 10 minutes for
// fenced transactions; TestFileRunsPastTheRolesTransactionTimeout): the
// role's timeout cut both short. Up returned "take the migration lock:
// ERROR: canceling statement due to statement timeout (SQLSTATE 57014)",
// or "FATAL: terminating connection due to transaction timeout (SQLSTATE
// 25P04)", as soon as the timeout passed; it now runs its session with
// both at 0.
func TestUpWaitsPastTheRolesTimeouts(t *testing.T) {
	t.Parallel()
	settings := []string{"statement_timeout=300ms"}
	if pgtest.HasSetting(t, "transaction_timeout") { // PostgreSQL 17 on
		settings = append(settings, "transaction_timeout=300ms")
	}
	for _, setting := range settings {
		t.Run(setting, func(t *testing.T) {
			t.Parallel()
			upWaitsForTheLock(t, setting)
		})
	}
}

func upWaitsForTheLock(t *testing.T, setting string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := pgtest.EmptyURL(t)
	holder := connect(t, base)
	var db string
	if err := holder.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	// golang-migrate's lock ID for (db, public, Table) (see advisoryLockID).
	lockID := int64(crc32.ChecksumIEEE([]byte("public\x00"+migrations.Table+"\x00"+db)) * uint32(1486364155))
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, lockID); err != nil {
		t.Fatal(err)
	}
	u := pgtest.WithSettings(base, setting)
	done := make(chan error, 1)
	go func() { done <- migrations.Up(ctx, u) }()
	// Up must still be waiting well after the role's timeout.
	pgtest.WaitFor(t, 30*time.Second, "Up to wait for the migration lock for a second", func() bool {
		select {
		case err := <-done:
			t.Fatalf("Up returned while another session held the migration lock: %v", err)
		default:
		}
		var waited bool
		if err := holder.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		   AND waitstart < clock_timestamp() - interval '1 second'
		   AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waited); err != nil {
			t.Fatal(err)
		}
		return waited
	})
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, lockID); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Up: %v", err)
	}
}

// TestFileRunsPastTheRolesTransactionTimeout: a migration's file runs in
// one transaction, and migration 9 waits in it for every open fenced
// transaction to end. A role's transaction_timeout (PostgreSQL 17) shorter
// than that wait ended the session part-way ("FATAL: terminating
// connection due to transaction timeout") and left the version dirty at
// 9, for an operator to force back by hand. Up now runs its session with
// transaction_timeout 0; here the fenced transaction stays open for twice
// the role's timeout, and Up then completes, clean.
func TestFileRunsPastTheRolesTransactionTimeout(t *testing.T) {
	t.Parallel()
	if !pgtest.HasSetting(t, "transaction_timeout") { // PostgreSQL 17 on
		t.Skip("no transaction_timeout on this server")
	}
	upgradeBesideFencedWriter(t, 8, "transaction_timeout=1s")
}
