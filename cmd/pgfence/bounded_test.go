package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// TestOneShotCommandsDoNotHang (scenario: the database stops answering a
// one-shot command once it is connected — here every statement that reads
// pgfence.leases queues behind an operator's ACCESS EXCLUSIVE lock, as it
// would behind a frozen or cut-off server). check, leases ls and fence
// bump give up after answerTimeout and exit 69, instead of leaving a cron
// job hanging for good.
func TestOneShotCommandsDoNotHang(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	lockLeasesTable(t, url) // until the parallel subtests are done
	for _, args := range [][]string{
		{"check", "--max-hold", "1h"},
		{"leases", "ls"},
		{"fence", "bump"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			r := db(t, url, args...)
			took := time.Since(start)
			if r.code != exitUnavailable || !strings.Contains(r.stderr, "did not answer within") {
				t.Errorf("pgfence %v with every read of pgfence.leases waiting: exit %d after %v, stderr %q; want %d",
					args, r.code, took, r.stderr, exitUnavailable)
			}
			if took < answerTimeout || took > answerTimeout+60*time.Second { // the bound, plus process start on a loaded machine
				t.Errorf("pgfence %v returned after %v, want about %v", args, took, answerTimeout)
			}
		})
	}
}

// lockLeasesTable takes an operator's ACCESS EXCLUSIVE lock on
// pgfence.leases in url's database, held until t (and its subtests) end:
// every statement on the table queues behind it, as behind a frozen or
// cut-off server.
func lockLeasesTable(t *testing.T, url string) {
	t.Helper()
	ctx := context.Background()
	locker, err := pgtest.PoolFor(t, url).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(locker.Release)
	for _, q := range []string{`BEGIN`, `LOCK TABLE pgfence.leases IN ACCESS EXCLUSIVE MODE`} {
		if _, err := locker.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() { _, _ = locker.Exec(ctx, `ROLLBACK`) })
}
