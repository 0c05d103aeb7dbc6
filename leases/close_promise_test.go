package leases

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// The promise (README, "Nothing leaks"; leases doc, "Failure handling"):
// no goroutine outlives Client.Close — Close "returns once every goroutine
// of the Client has exited". goleak after the package's tests would let a
// goroutine that ends a moment after Close pass (it retries); this test
// looks the moment Close returns, with every kind of goroutine a Client
// starts running: the keepalive, the listener and the wait-key connection
// (a waiter, an observer), an observer, and the end of a lost lease's
// grant.

// goroutine is one goroutine of a stack dump.
type goroutine struct {
	id    string // "goroutine 123"
	state string // "runnable", "select", "chan receive, 2 minutes", ...
	stack string
}

// running: runnable or running, finishing or on its way to block.
func (g goroutine) running() bool {
	return strings.HasPrefix(g.state, "runnable") || strings.HasPrefix(g.state, "running")
}

// waits: blocked until something else happens, as no finishing goroutine
// is (one that takes a mutex on its way out may be blocked on it).
func (g goroutine) waits() bool {
	for _, w := range []string{"chan ", "select", "IO wait", "sleep", "sync.Cond.Wait", "sync.WaitGroup.Wait"} {
		if strings.HasPrefix(g.state, w) {
			return true
		}
	}
	return false
}

// clientGoroutines returns the goroutines running code of package leases
// that no test function started.
func clientGoroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []goroutine
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.HasPrefix(g, "goroutine ") ||
			!strings.Contains(g, "pgfence/pgfence/leases.") ||
			strings.Contains(g, "testing.tRunner") || // a test's own goroutine (this one included)
			strings.Contains(g, "created by github.com/pgfence/pgfence/leases.Test") {
			continue
		}
		head, _, _ := strings.Cut(g, "\n")
		id, state, _ := strings.Cut(head, " [")
		found = append(found, goroutine{id: id, state: strings.TrimSuffix(state, "]:"), stack: g})
	}
	return found
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	// Not parallel: the stacks of other tests' Clients would be counted.
	pool := pgtest.Pool(t)
	ctx := testContext(t)
	before := map[string]bool{}
	for _, g := range clientGoroutines() {
		before[g.id] = true
	}
	if len(before) != 0 {
		t.Logf("goroutines of earlier tests still running: %d", len(before))
	}
	// busy is held by someone without a Client here, whose goroutines
	// would be counted.
	if _, err := pool.Exec(ctx, `SELECT * FROM pgfence.try_acquire('busy', 'someone', 60000000, NULL)`); err != nil {
		t.Fatal(err)
	}

	c, err := New(pool)
	if err != nil {
		t.Fatal(err)
	}
	var held []*Lease
	for _, name := range []string{"held/1", "held/2"} {
		l, err := c.TryAcquire(ctx, name, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	// A lease lost under its holder (its row expired by an operator),
	// whose loss the keepalive finds.
	lost, err := c.TryAcquire(ctx, "lost", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE pgfence.leases SET expires_at = clock_timestamp() WHERE name = 'lost'`); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "busy", time.Minute)
		waiting <- err
	}()
	obs, err := c.Observe(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	<-obs // the observer runs
	select {
	case <-lost.Done():
	case <-ctx.Done():
		t.Fatal("the keepalive never found the lease lost")
	}
	waitListening(t, c)

	// Close with nothing left to release, so that it makes no round trip
	// (which would give a goroutine it failed to wait for time to end).
	for _, l := range held {
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitFor(t, testTimeout, "the keepalive to end the lost lease's grant", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.orphans) == 0
	})
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	checkNoneOutlives(t, before)
	if err := <-waiting; !errors.Is(err, ErrClosed) {
		t.Errorf("waiting Acquire: %v, want ErrClosed", err)
	}
	for range obs {
	}
}

// checkNoneOutlives fails t if a goroutine of package leases not in
// before is blocked the moment it is called (one waiting for something
// outlives Close), or was runnable then and waits for something later or
// has not ended within 10s. Runnable or running is how a goroutine that
// Close waited for looks for the instructions after its WaitGroup Done,
// and context.AfterFunc's, which cancels a waiting call at Close, for
// cancel's last ones: they end in microseconds (10s is for a loaded
// machine). A goroutine Close did not wait for may be runnable too, on its
// way to block.
func checkNoneOutlives(t *testing.T, before map[string]bool) {
	t.Helper()
	finishing := map[string]string{}
	var blocked []string
	for _, g := range clientGoroutines() {
		switch {
		case before[g.id]:
		case g.running():
			finishing[g.id] = g.stack
		default:
			blocked = append(blocked, g.stack)
		}
	}
	if len(blocked) > 0 {
		t.Errorf("%d goroutines of package leases wait after Close returned:\n\n%s", len(blocked), strings.Join(blocked, "\n\n"))
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(finishing) > 0 {
		live := map[string]string{}
		for _, g := range clientGoroutines() {
			if _, ok := finishing[g.id]; !ok {
				continue
			}
			if g.waits() {
				t.Errorf("a goroutine of package leases, runnable when Close returned, waits since:\n\n%s", g.stack)
				return
			}
			live[g.id] = g.stack
		}
		finishing = live
		if len(finishing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			var stacks []string
			for _, s := range finishing {
				stacks = append(stacks, s)
			}
			t.Errorf("%d goroutines of package leases, runnable when Close returned, still run 10s later:\n\n%s", len(stacks), strings.Join(stacks, "\n\n"))
			return
		}
		time.Sleep(time.Millisecond) // polling the runtime's goroutines: nothing to wait on
	}
}
