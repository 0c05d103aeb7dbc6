package integration_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestComposeUp runs the playground as the README tells it: `compose up`
// starts PostgreSQL, the migrations and five demo workers built from the
// Dockerfile; every period is done exactly once; and a worker paused
// (docker pause: the cgroup freezer) while it holds a period's lease, until
// another worker has taken over and done the period, has its write
// rejected as stale when it is unpaused.
func TestComposeUp(t *testing.T) {
	t.Parallel()
	img := buildPgfenceImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := newComposeProject(t, img)
	start := time.Now()
	// --scale: docker-compose 1.x ignores deploy.replicas.
	p.run(ctx, "up", "-d", "--no-build", "--scale", "worker=5")
	t.Logf("compose up (postgres healthy, migrations applied, workers started) in %v", time.Since(start).Round(time.Millisecond))
	pool := p.pool(ctx)
	logs := p.followWorkers(ctx)

	mustWait(t, 2*time.Minute, "the workers to do three periods", func() (bool, error) {
		n, err := maxPeriod(ctx, pool)
		return n >= 3, err
	})

	// The pause may miss the window between the holder's check and its
	// write (the work takes 1s), or the holder may notice on waking that
	// its lease is gone before it writes; both are correct and retried.
	rejected := false
	for attempt := 1; attempt <= 8 && !rejected; attempt++ {
		rejected = pauseHolder(t, ctx, p, pool, logs)
	}
	if !rejected {
		t.Fatal("no paused holder's write was rejected as stale in 8 attempts")
	}

	p.run(ctx, "stop", "--timeout", "10", "worker")
	events := parseWorkerLines(p.run(ctx, "logs", "--no-color", "worker"))
	rows := periodRows(t, ctx, pool)
	checkExactlyOnce(t, rows, events)
}

// pauseHolder pauses the worker that next takes the lease of a period not
// yet done, keeps it frozen until another worker has done that period, and
// unpauses it. It reports whether the paused worker's write was then
// rejected as stale; it fails t if the worker wrote.
func pauseHolder(t *testing.T, ctx context.Context, p *composeProject, pool *pgxpool.Pool, logs *workerLogs) bool {
	t.Helper()
	var holder workerEvent
	logs.await(t, time.Minute, "a worker to take the lease of a period not yet done", func(e workerEvent) bool {
		if e.kind != "acquired" {
			return false
		}
		done, err := periodWriter(ctx, pool, e.period)
		if err != nil || done != "" {
			return false
		}
		holder = e
		return true
	})
	// Docker names a container's host after the first 12 hex digits of its
	// ID, and the demo worker is named host/pid.
	ctr, _, _ := strings.Cut(holder.worker, "/")
	p.dockerRun(ctx, "pause", ctr)
	paused := time.Now()
	t.Logf("paused %s (container %s) holding period %d", holder.worker, ctr, holder.period)

	// Until another worker has done the period: the paused one's lease
	// has expired and been taken over. Unless the pause took hold inside
	// the holder's fenced transaction, once its write had taken the fence
	// lock: a takeover waits for that transaction to end (fencing/doc.go,
	// "The fence lock"), which the server does only after
	// idle_in_transaction_session_timeout (5s, docker-compose.yml); the
	// wait below sees the open transaction long before.
	addr := strings.TrimSpace(p.dockerRun(ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", ctr))
	var writer string
	var inTx bool
	mustWait(t, time.Minute, fmt.Sprintf("period %d to be done", holder.period), func() (bool, error) {
		w, err := periodWriter(ctx, pool, holder.period)
		if err != nil || w != "" {
			writer = w
			return w != "", err
		}
		err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE client_addr = $1::inet AND state LIKE 'idle in transaction%')`, addr).Scan(&inTx)
		return inTx, err
	})
	p.dockerRun(ctx, "unpause", ctr)
	if writer == "" {
		t.Logf("missed the window: the pause took hold inside %s's fenced transaction; unpaused it", holder.worker)
		return false
	}
	t.Logf("period %d done by %s; unpaused %s after %v", holder.period, writer, holder.worker, time.Since(paused).Round(time.Millisecond))
	if writer == holder.worker {
		t.Logf("missed the window: %s wrote period %d before the pause took hold", holder.worker, holder.period)
		return false
	}

	var outcome workerEvent
	logs.await(t, time.Minute, fmt.Sprintf("%s to finish period %d", holder.worker, holder.period), func(e workerEvent) bool {
		if e.worker != holder.worker || e.period != holder.period {
			return false
		}
		switch e.kind {
		case "stale", "lost", "wrote", "skipped", "error":
			outcome = e
			return true
		}
		return false
	})
	switch outcome.kind {
	case "stale":
		t.Logf("the paused holder's write was rejected: %s", outcome.line)
		return true
	case "wrote":
		t.Fatalf("period %d done twice: by %s and by the paused %s: %s", holder.period, writer, holder.worker, outcome.line)
	case "error":
		t.Fatalf("the paused worker failed: %s", outcome.line)
	}
	t.Logf("the paused holder did not write (%s): %s", outcome.kind, outcome.line)
	return false
}

// dockerRun runs docker with args (for one container of the project).
func (p *composeProject) dockerRun(ctx context.Context, args ...string) string {
	p.t.Helper()
	return run(p.t, ctx, "", nil, "docker", args...)
}

// workerEvent is one line a demo worker printed.
type workerEvent struct {
	worker string // host/pid
	period int
	kind   string // acquired, skipped, wrote, stale, lost, error, other
	line   string
}

var workerLine = regexp.MustCompile(`(\S+/\d+): period (\d+): (.*)$`)

// parseWorkerLine reads a demo worker's line out of a compose log line
// ("worker_1  | host/1: period 3: ..." or "worker-1  | ...").
func parseWorkerLine(line string) (workerEvent, bool) {
	m := workerLine.FindStringSubmatch(line)
	if m == nil {
		return workerEvent{}, false
	}
	n, err := strconv.Atoi(m[2])
	if err != nil {
		return workerEvent{}, false
	}
	e := workerEvent{worker: m[1], period: n, kind: "other", line: m[0]}
	msg := m[3]
	switch {
	case strings.HasPrefix(msg, "acquired "):
		e.kind = "acquired"
	case strings.HasPrefix(msg, "already done"):
		e.kind = "skipped"
	case strings.HasPrefix(msg, "did the work"):
		e.kind = "wrote"
	case strings.Contains(msg, "REJECTED"):
		e.kind = "stale"
	case strings.HasPrefix(msg, "lease lost"):
		e.kind = "lost"
	case strings.HasPrefix(msg, "error"):
		e.kind = "error"
	}
	return e, true
}

func parseWorkerLines(out string) []workerEvent {
	var events []workerEvent
	for _, line := range strings.Split(out, "\n") {
		if e, ok := parseWorkerLine(line); ok {
			events = append(events, e)
		}
	}
	return events
}

// workerLogs follows the worker service's logs (compose logs -f) for the
// test: one process and one reader goroutine, stopped when the test ends.
type workerLogs struct {
	mu      sync.Mutex
	events  []workerEvent
	seen    int           // events already offered to an await
	changed chan struct{} // buffered 1: a new event arrived
	done    chan struct{} // closed when the reader has exited
}

func (p *composeProject) followWorkers(ctx context.Context) *workerLogs {
	p.t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, p.cmd[0], p.args("logs", "-f", "--no-color", "worker")...)
	cmd.Dir = p.root
	cmd.Env = append(cmd.Environ(), p.env...)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		p.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		p.t.Fatalf("compose logs -f: %v", err)
	}
	l := &workerLogs{changed: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if e, ok := parseWorkerLine(sc.Text()); ok {
				l.mu.Lock()
				l.events = append(l.events, e)
				l.mu.Unlock()
				select {
				case l.changed <- struct{}{}:
				default:
				}
			}
		}
	}()
	p.t.Cleanup(func() {
		cancel()
		<-l.done
		if err := cmd.Wait(); err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			p.t.Logf("compose logs -f: %v", err)
		}
	})
	return l
}

// await waits for the first event not offered before that match accepts,
// failing t after timeout.
func (l *workerLogs) await(t *testing.T, timeout time.Duration, what string, match func(workerEvent) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		fresh := l.events[l.seen:]
		l.seen = len(l.events)
		l.mu.Unlock()
		for _, e := range fresh {
			if match(e) {
				return
			}
		}
		select {
		case <-l.changed:
		case <-l.done:
			t.Fatalf("waiting for %s: the workers' log ended", what)
		case <-deadline.C:
			t.Fatalf("waiting for %s: not within %v", what, timeout)
		}
	}
}

// periodWriter returns the worker that did period n, or "" if none has.
func periodWriter(ctx context.Context, pool *pgxpool.Pool, n int) (string, error) {
	var w string
	err := pool.QueryRow(ctx, `SELECT worker FROM pgfence_demo.periods WHERE period = $1`, n).Scan(&w)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return w, err
}

// maxPeriod is the highest period done (0: none, or no table yet).
func maxPeriod(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var n int
	err := pool.QueryRow(ctx, `SELECT coalesce(max(period), 0) FROM pgfence_demo.periods`).Scan(&n)
	if err != nil {
		return 0, nil // the first worker has not created the table yet
	}
	return n, nil
}

// periodRows maps each period done to the worker that did it.
func periodRows(t *testing.T, ctx context.Context, pool *pgxpool.Pool) map[int]string {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT period, worker FROM pgfence_demo.periods`)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for rows.Next() {
		var n int
		var w string
		if err := rows.Scan(&n, &w); err != nil {
			t.Fatal(err)
		}
		out[n] = w
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkExactlyOnce compares the table with what the workers said: periods
// 1..max each have one row, written by the one worker that reported doing
// it; no worker reported work the table lacks; every stale rejection was
// of a period someone else did.
func checkExactlyOnce(t *testing.T, rows map[int]string, events []workerEvent) {
	t.Helper()
	wrote := map[int][]string{}
	stale := 0
	for _, e := range events {
		switch e.kind {
		case "wrote":
			wrote[e.period] = append(wrote[e.period], e.worker)
		case "stale":
			stale++
			if rows[e.period] == e.worker {
				t.Errorf("period %d: %s's write was rejected, yet the row is its: %s", e.period, e.worker, e.line)
			}
		}
	}
	last := 0
	for n := range rows {
		last = max(last, n)
	}
	for n := 1; n <= last; n++ {
		w, ok := rows[n]
		switch {
		case !ok:
			t.Errorf("period %d was never done (periods 1..%d)", n, last)
		case len(wrote[n]) != 1 || wrote[n][0] != w:
			t.Errorf("period %d: row by %s, workers reported writing it: %v", n, w, wrote[n])
		}
	}
	for n, ws := range wrote {
		if _, ok := rows[n]; !ok {
			t.Errorf("period %d: %v reported writing it, but it has no row", n, ws)
		}
	}
	t.Logf("%d periods, each done exactly once; %d stale writes rejected", last, stale)
}
