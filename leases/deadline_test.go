package leases

import (
	"container/heap"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The heap pops leases in deadline order whatever the order of pushes,
// fixes and removals, and every lease knows its place in it.
func TestDeadlineHeapOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	base := time.Now()
	var h deadlineHeap
	var in []*Lease
	check := func() {
		t.Helper()
		for i, e := range h {
			if e.l.dlPos != i+1 {
				t.Fatalf("lease at %d has dlPos %d", i, e.l.dlPos)
			}
			if !e.at.Equal(e.l.deadline) {
				t.Fatalf("lease at %d is ordered by %s, its deadline is %s", i, e.at, e.l.deadline)
			}
		}
	}
	for range 2000 {
		switch op := rng.IntN(4); {
		case op < 2 || len(in) == 0:
			l := &Lease{deadline: base.Add(time.Duration(rng.IntN(1e6)) * time.Microsecond)}
			heap.Push(&h, l)
			in = append(in, l)
		case op == 2:
			l := in[rng.IntN(len(in))]
			l.deadline = base.Add(time.Duration(rng.IntN(1e6)) * time.Microsecond)
			h.fix(l)
		default:
			i := rng.IntN(len(in))
			heap.Remove(&h, in[i].dlPos-1)
			if in[i].dlPos != 0 {
				t.Fatalf("removed lease has dlPos %d", in[i].dlPos)
			}
			in = slices.Delete(in, i, i+1)
		}
		check()
	}
	var prev time.Time
	for h.Len() > 0 {
		l := heap.Pop(&h).(*Lease)
		if l.deadline.Before(prev) {
			t.Fatalf("popped %s after %s", l.deadline, prev)
		}
		prev = l.deadline
	}
}

// A lease taken and released in a loop arms the deadline timer once, not
// per cycle, and leaves nothing on the heap.
func TestDeadlineTimerNotArmedPerCycle(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	ctx := testContext(t)
	var armed time.Time
	for i := range 20 {
		l, err := c.TryAcquire(ctx, "cycle", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		c.mu.Lock()
		a, n := c.dl.armed, c.dl.h.Len()
		c.mu.Unlock()
		if n != 1 {
			t.Fatalf("cycle %d: %d leases watched while one is held", i, n)
		}
		if i == 0 {
			armed = a
		} else if !a.Equal(armed) {
			t.Fatalf("cycle %d: timer re-armed for %s (first armed for %s)", i, a, armed)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.dl.h.Len(); n != 0 {
		t.Fatalf("%d leases watched after all were released", n)
	}
}

// Leases of a frozen holder are lost at their own deadlines, shortest TTL
// first, whatever order they were taken in; a released one is not lost,
// and a later Extend to a shorter TTL brings its loss forward.
func TestDeadlinesLoseInOrder(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	freeze(c)
	ctx := testContext(t)
	long, err := c.TryAcquire(ctx, "long", 4*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	released, err := c.TryAcquire(ctx, "released", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	short, err := c.TryAcquire(ctx, "short", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	extended, err := c.TryAcquire(ctx, "extended", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := extended.Extend(ctx, 2500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	leases := []*Lease{short, extended, long}
	lostAt := make([]time.Time, len(leases))
	done := make(chan int)
	for i, l := range leases {
		go func() {
			<-l.Context().Done()
			lostAt[i] = time.Now()
			done <- i
		}()
	}
	for range leases {
		select {
		case <-done:
		case <-time.After(testTimeout):
			t.Fatal("leases not lost by their deadlines")
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, l := range leases {
		if !errors.Is(l.Err(), ErrLost) {
			t.Errorf("%s ended with %v, want ErrLost", l.Name(), l.Err())
		}
		if lostAt[i].Before(l.deadline) {
			t.Errorf("%s lost at %s, before its deadline %s", l.Name(), lostAt[i], l.deadline)
		}
		// Deadlines are at least a second apart, far more than the timer's
		// lateness even on a loaded machine.
		if i > 0 && !lostAt[i].After(lostAt[i-1]) {
			t.Errorf("%s lost at %s, not after %s (%s)", l.Name(), lostAt[i], leases[i-1].Name(), lostAt[i-1])
		}
	}
	if !errors.Is(released.Err(), ErrReleased) {
		t.Errorf("released lease ended with %v, want ErrReleased", released.Err())
	}
}

// A batch that moves most deadlines at once re-sorts the heap at its end:
// the heap is then ordered as if each had been fixed, and the timer is
// armed for the earliest deadline set. A small batch fixes as it goes.
func TestDeadlineBatch(t *testing.T) {
	t.Parallel()
	c := &Client{}
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Now().Add(time.Hour) // the timer never fires
	at := func() time.Time { return base.Add(time.Duration(rng.IntN(1e6)) * time.Microsecond) }
	ls := make([]*Lease, 1000)
	for i := range ls {
		ls[i] = &Lease{}
		c.setDeadlineLocked(ls[i], at())
	}
	defer c.dl.timer.Stop()
	c.batchLocked(1)
	if c.dl.batch {
		t.Fatal("one deadline of 1000 moves in a batch")
	}
	c.batchLocked(800)
	if !c.dl.batch {
		t.Fatal("800 deadlines of 1000 do not move in a batch")
	}
	earliest := c.dl.armed
	for _, l := range ls[:800] {
		d := at().Add(-time.Millisecond)
		c.setDeadlineLocked(l, d)
		if d.Before(earliest) {
			earliest = d
		}
	}
	c.endBatchLocked()
	if c.dl.batch || !c.dl.armed.Equal(earliest) {
		t.Fatalf("after the batch: batch %v, armed for %s, want %s", c.dl.batch, c.dl.armed, earliest)
	}
	h := c.dl.h
	for i, e := range h {
		if e.l.dlPos != i+1 || !e.at.Equal(e.l.deadline) {
			t.Fatalf("entry %d: dlPos %d, at %s, deadline %s", i, e.l.dlPos, e.at, e.l.deadline)
		}
		if i > 0 && e.at.Before(h[(i-1)/2].at) {
			t.Fatalf("entry %d (%s) is before its parent (%s)", i, e.at, h[(i-1)/2].at)
		}
	}
}

// A renewal whose answer is recorded after the local deadline has passed,
// but before the deadline timer has marked the lease lost, does not move
// the deadline on: past it, the safety margin is spent, and the grant may
// expire in the database while the holder still works. The test holds c.mu
// across the deadline (so the timer cannot act) and records a renewal
// then, as a late answer would be; the lease keeps its deadline and ends
// lost.
func TestLateRenewalDoesNotRevive(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	freeze(c)
	l, err := c.TryAcquire(testContext(t), "late", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	deadline := l.deadline
	time.Sleep(time.Until(deadline) + 10*time.Millisecond) // past it by the clock, the timer blocked on c.mu
	c.renewedLocked(l, time.Now(), time.Now().Add(time.Second))
	after := l.deadline
	c.mu.Unlock()
	if !after.Equal(deadline) {
		t.Errorf("a renewal recorded after the local deadline moved it from %v to %v", deadline, after)
	}
	select {
	case <-l.Done():
	case <-time.After(testTimeout):
		t.Fatal("lease not lost")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Errorf("Err = %v, want ErrLost", l.Err())
	}
}
