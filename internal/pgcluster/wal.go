package pgcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// After an asynchronous failover the new primary may lack the last commits
// of the old one: its timeline forked off where its WAL ended. These
// helpers tell a test which commits those were, so that it can assert
// "nothing acknowledged was lost" only where nothing was.

// savedSegments is how many WAL segment files SaveWAL copies: the fork
// lies within the last few kilobytes of the old primary's WAL, and a
// segment is 16 MB.
const savedSegments = 3

// SaveWAL copies the most recently written WAL segment files of the data
// directory dataDir into dir, for LostCommits. Call it as soon as the old
// primary has stopped: a rewind, when it rejoins, rewrites its WAL past the
// fork. The newest are found by modification time, not by name: a
// checkpoint renames old segments to future names for reuse, and those
// hold stale records.
func SaveWAL(dataDir, dir string) error {
	wal := filepath.Join(dataDir, "pg_wal")
	ents, err := os.ReadDir(wal)
	if err != nil {
		return fmt.Errorf("pgcluster: save WAL: %w", err)
	}
	type seg struct {
		name string
		mod  time.Time
	}
	var segs []seg
	for _, e := range ents {
		if !walSegmentName.MatchString(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return fmt.Errorf("pgcluster: save WAL: %w", err)
		}
		segs = append(segs, seg{e.Name(), info.ModTime()})
	}
	if len(segs) == 0 {
		return fmt.Errorf("pgcluster: save WAL: no segment in %s", wal)
	}
	slices.SortFunc(segs, func(a, b seg) int { return b.mod.Compare(a.mod) })
	for _, s := range segs[:min(len(segs), savedSegments)] {
		if err := copyFile(filepath.Join(wal, s.name), filepath.Join(dir, s.name)); err != nil {
			return fmt.Errorf("pgcluster: save WAL: %w", err)
		}
	}
	return nil
}

var walSegmentName = regexp.MustCompile(`^[0-9A-F]{24}$`)

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}

// Fork reads, on the primary at url, where its timeline began: the timeline
// it forked off (its parent) and the LSN of the fork. WAL of the parent at
// or past that LSN never reached this primary.
func Fork(ctx context.Context, url string) (parent uint32, lsn string, err error) {
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		return 0, "", fmt.Errorf("pgcluster: fork: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	res := conn.ExecParams(ctx,
		`SELECT pg_read_file('pg_wal/' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) || '.history')`,
		nil, nil, nil, nil).Read()
	if res.Err != nil {
		return 0, "", fmt.Errorf("pgcluster: fork: read the timeline history: %w", res.Err)
	}
	return parseHistory(string(res.Rows[0][0]))
}

// parseHistory returns the last entry of a timeline history file: lines of
// "parentTLI<TAB>switchpoint<TAB>reason", oldest first.
func parseHistory(s string) (uint32, string, error) {
	var tli uint64
	var lsn string
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) < 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		t, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil || !strings.Contains(f[1], "/") {
			return 0, "", fmt.Errorf("pgcluster: fork: malformed history line %q", strings.TrimSpace(line))
		}
		tli, lsn = t, f[1]
	}
	if lsn == "" {
		return 0, "", errors.New("pgcluster: fork: the timeline history is empty (the server is on its first timeline)")
	}
	return uint32(tli), lsn, nil
}

// LostCommit is a transaction that committed in WAL the new primary never
// received.
type LostCommit struct {
	XID uint32
	At  time.Time // the commit record's time
	// Rels are the relations it changed, as pg_waldump names them:
	// "tablespace/database/filenode" (see RelFile).
	Rels []string
}

// LostCommits runs pg_waldump (the path waldump) over WAL saved by SaveWAL
// in dir, on timeline tli from lsn on, and returns the transactions that
// committed there, in WAL order.
func LostCommits(ctx context.Context, waldump, dir string, tli uint32, lsn string) ([]LostCommit, error) {
	cmd := exec.CommandContext(ctx, waldump, "--path", dir, "--timeline", strconv.FormatUint(uint64(tli), 10), "--start", lsn)
	cmd.Env = append(os.Environ(), "TZ=UTC") // commit times in UTC
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	// pg_waldump ends with an error where the WAL ends: "error in WAL
	// record at" after the records it printed, "could not find a valid
	// record after" the start when the WAL ends there — the usual case, where
	// the new primary had received all of it. Any other failure is an error.
	if err != nil && !strings.Contains(stderr.String(), "error in WAL record at") &&
		!strings.Contains(stderr.String(), "could not find a valid record after "+lsn) {
		return nil, fmt.Errorf("pgcluster: pg_waldump from %s on timeline %d: %w: %s", lsn, tli, err, strings.TrimSpace(stderr.String()))
	}
	return parseWALDump(string(out))
}

var (
	walRecordXID = regexp.MustCompile(`\btx:\s+(\d+),`)
	walRel       = regexp.MustCompile(`\brel (\d+/\d+/\d+)\b`)
	walCommit    = regexp.MustCompile(`desc: COMMIT (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC`)
)

// parseWALDump reads pg_waldump's records: which relations each
// transaction changed, and which transactions committed.
func parseWALDump(out string) ([]LostCommit, error) {
	rels := map[uint32][]string{}
	var commits []LostCommit
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := walRecordXID.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		x, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("pgcluster: pg_waldump: transaction id in %q: %w", line, err)
		}
		xid := uint32(x)
		if xid == 0 {
			continue // not a transaction's record
		}
		for _, r := range walRel.FindAllStringSubmatch(line, -1) {
			if !slices.Contains(rels[xid], r[1]) {
				rels[xid] = append(rels[xid], r[1])
			}
		}
		if strings.Contains(line, "rmgr: Transaction") {
			if c := walCommit.FindStringSubmatch(line); c != nil {
				at, err := time.Parse("2006-01-02 15:04:05.999999", c[1])
				if err != nil {
					return nil, fmt.Errorf("pgcluster: pg_waldump: commit time in %q: %w", line, err)
				}
				commits = append(commits, LostCommit{XID: xid, At: at})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("pgcluster: pg_waldump: %w", err)
	}
	for i := range commits {
		commits[i].Rels = rels[commits[i].XID]
	}
	return commits, nil
}

// RelFile names the table rel (a regclass literal: 'public.t') of the
// database at url as pg_waldump does, "tablespace/database/filenode", or
// "" when there is no such table.
func RelFile(ctx context.Context, url, rel string) (string, error) {
	conn, err := pgconn.Connect(ctx, url)
	if err != nil {
		return "", fmt.Errorf("pgcluster: relation file: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	res := conn.ExecParams(ctx, `
		SELECT concat_ws('/', CASE c.reltablespace WHEN 0 THEN d.dattablespace ELSE c.reltablespace END, d.oid, pg_relation_filenode(c.oid))
		  FROM pg_class c, pg_database d
		 WHERE c.oid = to_regclass($1) AND d.datname = current_database()`,
		[][]byte{[]byte(rel)}, nil, nil, nil).Read()
	if res.Err != nil {
		return "", fmt.Errorf("pgcluster: relation file of %s: %w", rel, res.Err)
	}
	if len(res.Rows) == 0 {
		return "", nil
	}
	return string(res.Rows[0][0]), nil
}
