package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestParseWALDump(t *testing.T) {
	out := `rmgr: Heap        len (rec/tot):     59/    59, tx:        735, lsn: 0/01555650, prev 0/01555608, desc: INSERT+INIT off 1 flags 0x00, blkref #0: rel 1663/5/16388 blk 0
rmgr: Btree       len (rec/tot):     72/    72, tx:        735, lsn: 0/01555608, prev 0/01553C48, desc: INSERT_LEAF off 135, blkref #0: rel 1663/5/16390 blk 7
rmgr: Heap        len (rec/tot):     54/    54, tx:        736, lsn: 0/01555700, prev 0/01555650, desc: HOT_UPDATE off 2 xmax 736, blkref #0: rel 1663/5/16400 fork main blk 3
rmgr: Transaction len (rec/tot):    405/   405, tx:        735, lsn: 0/01555690, prev 0/01555650, desc: COMMIT 2026-12-02 18:33:16.266364 UTC; inval msgs: catcache 80 relcache 16388
rmgr: Transaction len (rec/tot):     34/    34, tx:        736, lsn: 0/01555750, prev 0/01555700, desc: ABORT 2026-12-02 18:33:16.5 UTC
rmgr: Heap        len (rec/tot):     54/    54, tx:        737, lsn: 0/01555800, prev 0/01555750, desc: UPDATE off 3 xmax 737, blkref #0: rel 1663/5/16400 blk 3, blkref #1: rel 1663/5/16401 blk 9
rmgr: Transaction len (rec/tot):     34/    34, tx:        737, lsn: 0/01555850, prev 0/01555800, desc: COMMIT 2026-12-02 18:33:17 UTC
rmgr: Standby     len (rec/tot):     50/    50, tx:          0, lsn: 0/01555828, prev 0/01555690, desc: RUNNING_XACTS nextXid 738 latestCompletedXid 737 oldestRunningXid 738
`
	got, err := parseWALDump(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []LostCommit{
		{XID: 735, At: time.Date(2026, 12, 2, 18, 33, 16, 266364000, time.UTC), Rels: []string{"1663/5/16388", "1663/5/16390"}},
		{XID: 737, At: time.Date(2026, 12, 2, 18, 33, 17, 0, time.UTC), Rels: []string{"1663/5/16400", "1663/5/16401"}},
	}
	if len(got) != len(want) {
		t.Fatalf("parseWALDump = %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.XID != w.XID || !g.At.Equal(w.At) || len(g.Rels) != len(w.Rels) {
			t.Fatalf("commit %d = %+v, want %+v", i, g, w)
		}
		for j := range w.Rels {
			if g.Rels[j] != w.Rels[j] {
				t.Fatalf("commit %d = %+v, want %+v", i, g, w)
			}
		}
	}
}

func TestParseHistory(t *testing.T) {
	tli, lsn, err := parseHistory("1\t0/4103310\tno recovery target specified\n\n2\t0/5000A28\tno recovery target specified\n")
	if err != nil || tli != 2 || lsn != "0/5000A28" {
		t.Fatalf("parseHistory = %d %q %v, want 2 0/5000A28", tli, lsn, err)
	}
	for _, bad := range []string{"", "\n", "x\t0/1\tr\n", "1\tnolsn\tr\n"} {
		if _, _, err := parseHistory(bad); err == nil {
			t.Errorf("parseHistory(%q) = no error", bad)
		}
	}
}

// TestLostCommits loses a commit as asynchronous replication can: the
// primary acknowledges it while its WAL sender is frozen, dies, and its
// standby is promoted. LostCommits must find that commit, with the table
// it wrote, and not one the standby had received; and, where the standby
// had received everything (the usual failover), find none without error.
func TestLostCommits(t *testing.T) {
	for _, freeze := range []bool{true, false} {
		name := map[bool]string{true: "lost", false: "none"}[freeze]
		t.Run(name, func(t *testing.T) { testLostCommits(t, freeze) })
	}
}

func testLostCommits(t *testing.T, freeze bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Close() })
	exec := func(url, sql string) string {
		t.Helper()
		conn, err := pgconn.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		res, err := conn.Exec(ctx, sql).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		last := res[len(res)-1]
		if len(last.Rows) == 0 {
			return ""
		}
		return string(last.Rows[0][0])
	}
	var standbyURL string
	replayed := func(what string) {
		t.Helper()
		at := exec(primary.URL("postgres"), `SELECT pg_current_wal_lsn()`)
		waitFor(t, ctx, "the standby to replay "+what, func() bool {
			return exec(standbyURL, `SELECT pg_last_wal_replay_lsn() >= '`+at+`'`) == "t"
		})
	}
	exec(primary.URL("postgres"), `CREATE TABLE kept (x int); CREATE TABLE lost (x int)`)
	standby, err := primary.NewStandby()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Close() })
	standbyURL = standby.URL("postgres")

	keptXID := exec(primary.URL("postgres"), `INSERT INTO kept VALUES (1) RETURNING pg_current_xact_id()`)
	replayed("the first commit")
	if freeze {
		walsender, err := strconv.Atoi(exec(primary.URL("postgres"), `SELECT pid FROM pg_stat_replication`))
		if err != nil {
			t.Fatalf("the primary's WAL sender: %v", err)
		}
		if err := syscall.Kill(walsender, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	lostXID := exec(primary.URL("postgres"), `INSERT INTO lost VALUES (1) RETURNING pg_current_xact_id()`)
	lostRel, err := RelFile(ctx, primary.URL("postgres"), "lost")
	if err != nil || lostRel == "" {
		t.Fatalf("RelFile(lost) = %q, %v", lostRel, err)
	}
	if !freeze {
		replayed("the second commit")
	}
	before := time.Now()
	if err := primary.Kill(); err != nil { // the frozen WAL sender too
		t.Fatal(err)
	}
	// A checkpoint renames old segments to the names WAL will take next,
	// for reuse: stale records under future names, written long ago.
	// SaveWAL must not take them for the newest.
	recycle(t, filepath.Join(primary.DataDir(), "pg_wal"), before.Add(-time.Hour))
	dir := t.TempDir()
	if err := SaveWAL(primary.DataDir(), dir); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[bool]string{true: "0", false: "1"}[freeze]
	if got := exec(standby.URL("postgres"), `SELECT count(*) FROM lost`); got != want {
		t.Fatalf("the promoted standby has %s rows of the second commit, want %s", got, want)
	}
	tli, lsn, err := Fork(ctx, standby.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	waldump, err := primary.Tool("pg_waldump")
	if err != nil {
		t.Fatal(err)
	}
	lost, err := LostCommits(ctx, waldump, dir, tli, lsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("forked off timeline %d at %s; lost %+v", tli, lsn, lost)
	var found bool
	for _, c := range lost {
		switch strconv.FormatUint(uint64(c.XID), 10) {
		case keptXID:
			t.Errorf("LostCommits reports transaction %s, which the standby replayed", keptXID)
		case lostXID:
			found = true
			if len(c.Rels) != 1 || c.Rels[0] != lostRel {
				t.Errorf("lost transaction %s wrote %v, want [%s]", lostXID, c.Rels, lostRel)
			}
			// Generous: the commit record's time is the server's clock, the
			// same machine's, taken before the kill.
			if c.At.After(before) || c.At.Before(before.Add(-time.Minute)) {
				t.Errorf("lost transaction %s committed at %v, want shortly before %v", lostXID, c.At, before)
			}
		}
	}
	switch {
	case freeze && !found:
		t.Errorf("LostCommits = %+v, want transaction %s among them", lost, lostXID)
	case !freeze && found:
		t.Errorf("LostCommits reports transaction %s, which the standby replayed", lostXID)
	}
}

// recycle does what a checkpoint does to a segment it keeps for reuse:
// copies the oldest segment of pgWAL under the three names that follow the
// newest, with modification time mod.
func recycle(t *testing.T, pgWAL string, mod time.Time) {
	t.Helper()
	ents, err := os.ReadDir(pgWAL)
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, e := range ents {
		if walSegmentName.MatchString(e.Name()) {
			segs = append(segs, e.Name()) // ReadDir sorts by name
		}
	}
	if len(segs) == 0 {
		t.Fatalf("no WAL segment in %s", pgWAL)
	}
	old, err := os.ReadFile(filepath.Join(pgWAL, segs[0]))
	if err != nil {
		t.Fatal(err)
	}
	last := segs[len(segs)-1]
	n, err := strconv.ParseUint(last[16:], 16, 32)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(3) {
		f := filepath.Join(pgWAL, fmt.Sprintf("%s%08X", last[:16], n+1+i))
		if err := os.WriteFile(f, old, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(f, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds: a standby's progress has no event to
// wait on.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
