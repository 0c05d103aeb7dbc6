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

// clientGoroutines returns the stacks of the blocked goroutines running
// code of package leases that no test function started.
func clientGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var found []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "pgfence/pgfence/leases.") ||
			strings.Contains(g, "testing.tRunner") || // a test's own goroutine (this one included)
			strings.Contains(g, "created by github.com/pgfence/pgfence/leases.Test") ||
			// Runnable or running: finishing. A goroutine that Close waits
			// for by a WaitGroup still exists for the instructions after
			// its Done, and context.AfterFunc's goroutine, which cancels a
			// waiting call at Close, for cancel's last ones; neither can
			// block again. One that outlives Close by waiting for
			// something is blocked (select, IO wait, chan receive, ...).
			strings.HasPrefix(g, "goroutine ") && (strings.Contains(firstLine(g), "[runnable") || strings.Contains(firstLine(g), "[running")) {
			continue
		}
		found = append(found, g)
	}
	return found
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	// Not parallel: the stacks of other tests' Clients would be counted.
	pool := pgtest.Pool(t)
	ctx := testContext(t)
	before := clientGoroutines()
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
	if left := clientGoroutines(); len(left) > len(before) {
		t.Errorf("%d goroutines of package leases still run after Close returned (%d before):\n\n%s",
			len(left), len(before), strings.Join(left, "\n\n"))
	}
	if err := <-waiting; !errors.Is(err, ErrClosed) {
		t.Errorf("waiting Acquire: %v, want ErrClosed", err)
	}
	for range obs {
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
