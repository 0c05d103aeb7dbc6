package leases

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

const (
	helperEnvHandoverURL = "PGFENCE_LEASES_HANDOVER_URL"
	handoverTTL          = 15 * time.Second // TTL/3 = 5s: far above a notified hand-over
)

// Hand-over across processes: a leader in another OS process (Lead, TTL
// 15s) is asked to step down while this process waits for the lease. The
// leader's fn context ends with cause ErrHandover, it releases, and the
// waiter holds the lease within a round trip or so — far below TTL/3, the
// latest the leader's next renewal would have come — and only after the
// leader's fn had returned (by the database clock): no stale-holder window.
func TestHandoverAcrossProcesses(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url)
	ctx := testContext(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE stepped (fence bigint PRIMARY KEY, cause text NOT NULL,
		ended_at timestamptz NOT NULL DEFAULT clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHandoverHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnvHandoverURL+"="+url)
	// The helper's output goes into this test's log if it fails, as
	// TestExclusiveAcrossProcesses's does: written to this process's
	// stderr, it landed among other tests' output.
	var out bytes.Buffer
	listened := &watchWriter{w: &out, match: "leases: listening for releases", seen: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = listened, listened
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("the helper process's output:\n%s", out.String())
		}
	})
	waitFor(t, pool, `SELECT EXISTS (SELECT FROM pgfence.leases WHERE name = $1 AND owner LIKE 'helper-%' AND expires_at > clock_timestamp())`, "deploy/leader")
	// The premise: the leader listens (TestRequestBeforeListening covers a
	// request that comes before; on a loaded machine its LISTEN can come
	// seconds after the grant).
	select {
	case <-listened.seen:
	case <-ctx.Done():
		t.Fatal("the leader's client never logged that it listens")
	}

	waiting := make(chan struct{}, 1)
	b := hookWait(newClient(t, pool, WithOwner("next"), WithPollInterval(time.Minute)), func(string) { signal(waiting) })
	op := newClient(t, pgtest.PoolFor(t, url), WithOwner("operator"))
	got := make(chan *Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, "deploy/leader", time.Minute)
		if err != nil {
			t.Errorf("Acquire: %v", err)
		}
		got <- l
	}()
	<-waiting
	begin := time.Now()
	asked, err := op.RequestHandover(ctx, "deploy/leader", 10*time.Second)
	if err != nil {
		t.Fatalf("RequestHandover: %v", err)
	}
	lb := <-got
	took := time.Since(begin)
	t.Logf("hand-over across processes: %s (leader TTL %s)", took, handoverTTL)
	if lb == nil {
		t.FailNow()
	}
	if took > 2*time.Second {
		t.Errorf("hand-over took %s, want far below TTL/3 = %s", took, handoverTTL/3)
	}
	if !strings.HasPrefix(asked.Owner, "helper-") || lb.Fence() <= asked.Fence {
		t.Errorf("asked %+v, new grant fence %d; want the helper's grant, then a higher fence", asked, lb.Fence())
	}
	var cause string
	var ended, acquired time.Time
	err = pool.QueryRow(ctx, `SELECT s.cause, s.ended_at, l.acquired_at FROM stepped s, pgfence.leases l
		WHERE s.fence = $1 AND l.name = 'deploy/leader'`, asked.Fence).Scan(&cause, &ended, &acquired)
	if err != nil {
		t.Fatalf("the leader recorded no step-down: %v", err)
	}
	if !strings.Contains(cause, ErrHandover.Error()) {
		t.Errorf("leader's context cause %q, want ErrHandover", cause)
	}
	if !ended.Before(acquired) {
		t.Errorf("the leader's fn ended at %s, after the next grant at %s", ended, acquired)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("helper process: %v", waitErr)
		}
	case <-ctx.Done():
		t.Error("helper process did not exit after handing over")
	}
}

// watchWriter writes to w and closes seen once what was written contains
// match (across writes). os/exec calls Write from one goroutine.
type watchWriter struct {
	w     io.Writer
	match string
	seen  chan struct{}
	found bool
	tail  []byte // the end of what was written, shorter than match
}

func (ww *watchWriter) Write(p []byte) (int, error) {
	if !ww.found {
		buf := append(ww.tail, p...)
		if bytes.Contains(buf, []byte(ww.match)) {
			ww.found, ww.tail = true, nil
			close(ww.seen)
		} else {
			ww.tail = bytes.Clone(buf[max(0, len(buf)-len(ww.match)+1):])
		}
	}
	return ww.w.Write(p)
}

// TestHandoverHelperProcess is the leader of TestHandoverAcrossProcesses:
// it leads until asked to hand over, records the cause, and exits.
func TestHandoverHelperProcess(t *testing.T) {
	url := os.Getenv(helperEnvHandoverURL)
	if url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	// Its log goes to the test's output when the test fails: when the
	// hand-over is slow, it says when the leader listened and heard the
	// request.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := New(pool, WithOwner("helper"), WithLogger(log.With("process", "helper")))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	err = c.Lead(lctx, "deploy/leader", handoverTTL, func(fctx context.Context, l *Lease) error {
		<-fctx.Done()
		_, err := pool.Exec(ctx, `INSERT INTO stepped (fence, cause) VALUES ($1, $2)`, l.Fence(), fmt.Sprint(context.Cause(fctx)))
		stop() // one term is enough: exit after the hand-over
		return err
	})
	if err != nil {
		t.Fatalf("Lead: %v", err)
	}
}

// A holder that does not release is reported, not forced: the request
// times out with ErrHandoverTimeout naming it, and it still holds the
// lease (its context says ErrHandover). Nobody holding: ErrNotHeld. A
// later grant of the name is not affected by the old request.
func TestHandoverUnresponsiveHolder(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, op := cs[0], cs[1]
	ctx := testContext(t)
	waitListening(t, a) // the holder hears the request at once
	l, err := a.TryAcquire(ctx, "stubborn", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = op.RequestHandover(ctx, "stubborn", time.Second)
	if !errors.Is(err, ErrHandoverTimeout) || !strings.Contains(err.Error(), l.Owner()) {
		t.Errorf("RequestHandover of a holder that ignores it: %v, want ErrHandoverTimeout naming %s", err, l.Owner())
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("holder's context did not end")
	}
	if !errors.Is(l.Err(), ErrHandover) {
		t.Errorf("holder's cause: %v, want ErrHandover", l.Err())
	}
	if info, err := op.Get(ctx, "stubborn"); err != nil || info.Fence != l.Fence() {
		t.Errorf("after the timeout: %+v, %v; want the holder still holding", info, err)
	}
	// Still renewed while it finishes: a renewal after the request keeps it.
	if err := a.renewNow(ctx, l); err != nil {
		t.Errorf("renewal after the request: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release after a hand-over request: %v", err)
	}
	if _, err := op.RequestHandover(ctx, "stubborn", time.Second); !errors.Is(err, ErrNotHeld) {
		t.Errorf("RequestHandover of a free lease: %v, want ErrNotHeld", err)
	}
	l2, err := a.TryAcquire(ctx, "stubborn", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.renewNow(ctx, l2); err != nil || l2.Err() != nil {
		t.Errorf("next grant after an old request: %v, %v; want held, no hand-over", err, l2.Err())
	}
	if _, err := op.RequestHandover(ctx, "stubborn", 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("zero timeout: %v, want ErrInvalid", err)
	}
}

// renewNow runs one keepalive batch for l, as the keepalive would.
func (c *Client) renewNow(ctx context.Context, l *Lease) error {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	if again := c.renewBatch(ctx, []renewal{{l, l.TTL()}}, lostRenewRejected); again {
		return errors.New("renewal failed or busy")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l.state != stateHeld {
		return fmt.Errorf("lease not held: %w", context.Cause(l.ctx))
	}
	return nil
}

// The operator's escalation (scenario): a hand-over request times out, so
// the operator force-releases the lease, and the holder's work, which had
// not stopped, finishes after the loss. Run must say the lease was lost
// (its work may not have been exclusive), as for any loss while fn ran,
// and so must the Lease: Err, and Release. The hand-over request ended
// the lease's Context first, which hid every later loss behind
// ErrHandover.
func TestRunReportsLossAfterHandoverRequest(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, op := cs[0], cs[1]
	ctx := testContext(t)
	waitListening(t, a) // the holder hears the request at once
	var held *Lease
	err := a.Run(ctx, "escalated", time.Minute, func(fctx context.Context, l *Lease) error {
		held = l
		if _, err := op.RequestHandover(ctx, "escalated", time.Second); !errors.Is(err, ErrHandoverTimeout) {
			t.Errorf("RequestHandover of a holder that goes on: %v, want ErrHandoverTimeout", err)
		}
		<-fctx.Done()
		if !errors.Is(context.Cause(fctx), ErrHandover) {
			t.Errorf("fn's cause: %v, want ErrHandover", context.Cause(fctx))
		}
		if err := op.ForceRelease(ctx, "escalated"); err != nil {
			t.Errorf("ForceRelease: %v", err)
		}
		// The holder's client learns of it (this renewal, or the one the
		// notification brought forward, finds the grant gone).
		if err := a.renewNow(ctx, l); err == nil {
			t.Error("renewal after the force-release succeeded")
		}
		return nil // the work finishes, unaware
	})
	if !errors.Is(err, ErrLost) {
		t.Errorf("Run after a loss that followed a hand-over request = %v, want ErrLost", err)
	}
	if held == nil {
		t.Fatal("fn never ran")
	}
	if !errors.Is(held.Err(), ErrLost) {
		t.Errorf("Lease.Err after the loss: %v, want ErrLost", held.Err())
	}
	if err := held.Release(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("Release after the loss: %v, want ErrLost", err)
	}
}

// A holder asked to hand over still holds the lease until it releases
// it, and may use it while it winds down: Renew, Extend (more time to
// finish cleanly) and SetData (publish "draining") work, as their
// documentation says they do until the lease is no longer held.
func TestLeaseUsableAfterHandoverRequest(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, op := cs[0], cs[1]
	ctx := testContext(t)
	waitListening(t, a) // the holder hears the request at once
	l, err := a.TryAcquire(ctx, "winding-down", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.RequestHandover(ctx, "winding-down", time.Second); !errors.Is(err, ErrHandoverTimeout) {
		t.Fatalf("RequestHandover: %v, want ErrHandoverTimeout", err)
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("holder's context did not end")
	}
	if !errors.Is(l.Err(), ErrHandover) {
		t.Fatalf("holder's cause: %v, want ErrHandover", l.Err())
	}
	if err := l.Renew(ctx); err != nil {
		t.Errorf("Renew while winding down: %v", err)
	}
	if err := l.Extend(ctx, 2*time.Minute); err != nil {
		t.Errorf("Extend while winding down: %v", err)
	}
	if err := l.SetData(ctx, json.RawMessage(`"draining"`)); err != nil {
		t.Errorf("SetData while winding down: %v", err)
	}
	info, err := op.Get(ctx, "winding-down")
	if err != nil || string(info.Data) != `"draining"` || info.Fence != l.Fence() || l.TTL() != 2*time.Minute {
		t.Errorf("after winding down: %+v, %v, TTL %s; want the holder's grant with its data and TTL 2m", info, err, l.TTL())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.SetData(ctx, nil); !errors.Is(err, ErrReleased) {
		t.Errorf("SetData after Release: %v, want ErrReleased", err)
	}
}

// A hand-over request whose ctx ends before its timeout says so: the wait
// was cut short by the caller, not timed out. The error wraps ctx's error,
// names the holder, which keeps the lease, and does not match
// ErrHandoverTimeout, whose message would claim the holder held on for the
// whole timeout.
func TestHandoverRequestContextEnds(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, op := cs[0], cs[1]
	ctx := testContext(t)
	l, err := a.TryAcquire(ctx, "cut-short", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// ctx ends 1 s in: long enough for the request, one round trip, to be
	// recorded first even on a loaded CI machine (it must be, for the
	// holder to be named; TestHandoverRequestEndsBeforeTheWait covers an
	// end right after it), and far short of the 1m timeout.
	const cut = time.Second
	for _, tc := range []struct {
		name string
		want error
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"deadline", context.DeadlineExceeded, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, cut)
		}},
		{"cancel", context.Canceled, func() (context.Context, context.CancelFunc) {
			rctx, cancel := context.WithCancel(ctx)
			time.AfterFunc(cut, cancel)
			return rctx, cancel
		}},
	} {
		rctx, cancel := tc.ctx()
		_, err := op.RequestHandover(rctx, "cut-short", time.Minute)
		cancel()
		if !errors.Is(err, tc.want) || errors.Is(err, ErrHandoverTimeout) || !strings.Contains(err.Error(), l.Owner()) ||
			strings.Contains(err.Error(), "after 1m0s") {
			t.Errorf("%s: RequestHandover whose ctx ends first: %v; want an error wrapping %v, naming %s, not ErrHandoverTimeout",
				tc.name, err, tc.want, l.Owner())
		}
	}
	if info, err := op.Get(ctx, "cut-short"); err != nil || info.Fence != l.Fence() {
		t.Errorf("after the request: %+v, %v; want the holder still holding", info, err)
	}
}

// The request is recorded and then, before the wait has begun, ctx ends
// (or the timeout is shorter than the step from the request to the wait).
// The error is still the wait's: cut short, naming the holder, or
// ErrHandoverTimeout — never a bare "context canceled" that hides that the
// holder was asked. CI once hit the first case under load.
func TestHandoverRequestEndsBeforeTheWait(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	a := newClient(t, pgtest.PoolFor(t, url))
	rctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	op := newClient(t, pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) {
		// ctx ends the moment the request has returned its row.
		cfg.ConnConfig.Tracer = statementEnd{sqlRequestHandover, func(err error) {
			if err == nil {
				cancel()
			}
		}}
	}))
	ctx := testContext(t)
	l, err := a.TryAcquire(ctx, "asked", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, err = op.RequestHandover(rctx, "asked", time.Minute)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrHandoverTimeout) || !strings.Contains(err.Error(), l.Owner()) {
		t.Errorf("ctx canceled right after the request: %v; want an error wrapping context canceled, naming %s", err, l.Owner())
	}
	_, err = op.RequestHandover(ctx, "asked", time.Nanosecond)
	if !errors.Is(err, ErrHandoverTimeout) || !strings.Contains(err.Error(), l.Owner()) {
		t.Errorf("timeout of 1ns: %v; want ErrHandoverTimeout naming %s", err, l.Owner())
	}
	if info, err := op.Get(ctx, "asked"); err != nil || info.Fence != l.Fence() {
		t.Errorf("after the requests: %+v, %v; want the holder still holding", info, err)
	}
}

// Run and Once whose fn returns its context's error after an operator's
// hand-over request name ErrHandover in what they return, beside fn's
// context.Canceled: a caller could not tell a hand-over from its own
// cancellation.
func TestHandoverIsNamedInFnError(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, op := cs[0], cs[1]
	ctx := testContext(t)
	waitListening(t, a) // the holder hears the request at once
	asked := make(chan error, 1)
	stepDown := func(name string) func(context.Context, *Lease) error {
		return func(context.Context, *Lease) error {
			_, err := op.RequestHandover(ctx, name, time.Minute) // returns once the holder let go
			asked <- err
			return nil
		}
	}
	err := a.Run(ctx, "named/run", time.Minute, func(fctx context.Context, l *Lease) error {
		go func() { _ = stepDown("named/run")(fctx, l) }()
		<-fctx.Done()
		return fctx.Err()
	})
	if !errors.Is(err, ErrHandover) || !errors.Is(err, context.Canceled) {
		t.Errorf("Run after a hand-over request = %v, want ErrHandover and context.Canceled", err)
	}
	if err := <-asked; err != nil {
		t.Errorf("RequestHandover of the Run: %v", err)
	}
	did, err := a.Once(ctx, "named/once", "p1", time.Minute, func(fctx context.Context, l *Lease) error {
		go func() { _ = stepDown("named/once")(fctx, l) }()
		<-fctx.Done()
		return fctx.Err()
	})
	if did || !errors.Is(err, ErrHandover) || !errors.Is(err, context.Canceled) {
		t.Errorf("Once after a hand-over request = %v, %v; want false, ErrHandover and context.Canceled", did, err)
	}
	if err := <-asked; err != nil {
		t.Errorf("RequestHandover of the Once: %v", err)
	}
}

// watchWriter finds its text split across writes, forwards every byte,
// and does not fire on a near miss.
func TestWatchWriter(t *testing.T) {
	var out bytes.Buffer
	ww := &watchWriter{w: &out, match: "listening for releases", seen: make(chan struct{})}
	for _, p := range []string{"a listening for rel", "ax; ", "listening for rel"} {
		if _, err := ww.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ww.seen:
		t.Fatal("seen before the text was written")
	default:
	}
	for _, p := range []string{"eases", " and more"} {
		if _, err := ww.Write([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-ww.seen:
	default:
		t.Fatal("not seen after the text was written across two writes")
	}
	if want := "a listening for relax; listening for releases and more"; out.String() != want {
		t.Errorf("forwarded %q, want %q", out.String(), want)
	}
}
