package leases

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/fencing"
)

func TestSemaphoreInvalid(t *testing.T) {
	t.Parallel()
	c, _ := setup(t)
	for _, tc := range []struct {
		name  string
		slots int
		want  string
	}{
		{"", 1, "lease name must be 1..200 bytes, got 0"},
		{"s", 0, "slots must be between 1 and 1000, got 0"},
		{"s", MaxSlots + 1, "slots must be between 1 and 1000, got 1001"},
		{strings.Repeat("x", MaxNameLen-2), 10, `leave room for "#10"`},
	} {
		_, err := c.Semaphore(tc.name, tc.slots)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Semaphore(%d bytes, %d) = %v, want ErrInvalid saying %q", len(tc.name), tc.slots, err, tc.want)
		}
	}
	s, err := c.Semaphore(strings.Repeat("x", MaxNameLen-3), 10)
	if err != nil {
		t.Fatalf("Semaphore with a name that just fits: %v", err)
	}
	if _, err := s.Acquire(testContext(t), 500*time.Millisecond); !errors.Is(err, ErrInvalid) {
		t.Errorf("Acquire with ttl 500ms = %v, want ErrInvalid", err)
	}
}

// N slots give N grants, each a lease "<name>#<k>" with its own fence; the
// next TryAcquire finds the semaphore full and names the slot that frees
// first; a released slot is granted again with a higher fence.
func TestSemaphoreSlots(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	ctx := testContext(t)
	sa, err := cs[0].Semaphore("pool/db", 3)
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := cs[1].Semaphore("pool/db", 3)
	var held []*Lease
	for i := range 3 {
		s := sa
		if i%2 == 1 {
			s = sb
		}
		l, err := s.TryAcquire(ctx, time.Minute)
		if err != nil {
			t.Fatalf("TryAcquire %d: %v", i+1, err)
		}
		if l.Slot() != i+1 || l.Name() != fmt.Sprintf("pool/db#%d", i+1) || l.Token().Lease != l.Name() {
			t.Errorf("grant %d: slot %d, name %q, token %v", i+1, l.Slot(), l.Name(), l.Token())
		}
		held = append(held, l)
	}
	_, err = sb.TryAcquire(ctx, time.Minute)
	var he *HeldError
	if !errors.As(err, &he) || !errors.Is(err, ErrHeld) || he.Holder.Name != "pool/db#1" || he.Holder.Fence != held[0].Fence() {
		t.Fatalf("fourth TryAcquire = %v, want *HeldError naming slot 1 (fence %d)", err, held[0].Fence())
	}
	hs, err := sa.Holders(ctx)
	if err != nil || len(hs) != 3 || hs[2].Fence != held[2].Fence() {
		t.Fatalf("Holders = %+v, %v; want the three grants", hs, err)
	}
	if err := held[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := sa.TryAcquire(ctx, time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire after a release: %v", err)
	}
	if l.Slot() != 2 || l.Fence() <= held[1].Fence() {
		t.Errorf("regrant: slot %d fence %d; want slot 2 with a fence above %d", l.Slot(), l.Fence(), held[1].Fence())
	}
	// A plain lease of the same name is another lease.
	if _, err := cs[0].TryAcquire(ctx, "pool/db", time.Minute); err != nil {
		t.Errorf("plain lease named like the semaphore: %v", err)
	}
}

// A waiter is woken by the release of any slot, by notification: with a
// one-hour poll and hour-long grants, nothing else could wake it.
func TestSemaphoreWaiterWokenByRelease(t *testing.T) {
	t.Parallel()
	sleeping := make(chan struct{}, 1)
	cs, _ := clients(t, 2, WithPollInterval(time.Hour))
	for _, c := range cs {
		hookWait(c, func(string) { signal(sleeping) })
	}
	ctx := testContext(t)
	sa, _ := cs[0].Semaphore("workers", 2)
	sb, _ := cs[1].Semaphore("workers", 2)
	one, err := sa.Acquire(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	two, err := sa.Acquire(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	waitListening(t, cs[1])
	got := make(chan *Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := sb.Acquire(ctx, time.Hour)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	// Wait until the waiter has tried and gone to sleep, then free slot 2.
	select {
	case <-sleeping:
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(testTimeout):
		t.Fatal("the waiter never went to sleep")
	}
	if err := two.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-got:
		if l.Slot() != 2 || l.Fence() <= two.Fence() {
			t.Errorf("waiter got slot %d fence %d; want slot 2 above fence %d", l.Slot(), l.Fence(), two.Fence())
		}
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not woken within 10s of a slot's release")
	}
	_ = one
}

// Goroutines of several clients contend for a semaphore of 3 slots: never
// more than 3 hold at once, and each slot's fences increase in grant order.
func TestSemaphoreContention(t *testing.T) {
	t.Parallel()
	const slots, clientsN, perClient, rounds = 3, 4, 2, 8
	cs, _ := clients(t, clientsN, WithPollInterval(200*time.Millisecond))
	ctx := testContext(t)
	var (
		holding, most atomic.Int32
		mu            sync.Mutex
		grants        = map[int][]*Lease{}
		wg            sync.WaitGroup
		errs          = make(chan error, clientsN*perClient)
	)
	for _, c := range cs {
		s, err := c.Semaphore("contended", slots)
		if err != nil {
			t.Fatal(err)
		}
		for range perClient {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					err := s.Run(ctx, 5*time.Second, func(ctx context.Context, l *Lease) error {
						n := holding.Add(1)
						defer holding.Add(-1)
						for {
							m := most.Load()
							if n <= m || most.CompareAndSwap(m, n) {
								break
							}
						}
						mu.Lock()
						grants[l.Slot()] = append(grants[l.Slot()], l)
						mu.Unlock()
						time.Sleep(2 * time.Millisecond) // hold a moment: widen any overlap
						return ctx.Err()
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Run: %v", err)
	}
	// Never more than the slots. (That the slots admit as many holders at
	// once is TestSemaphoreSlots's to show: here, on a loaded machine,
	// holds of 2 ms need not overlap at all.)
	if m := most.Load(); m > slots || m < 1 {
		t.Errorf("at most %d holders at once, want between 1 and %d", m, slots)
	}
	total := 0
	for slot, ls := range grants {
		total += len(ls)
		if slot < 1 || slot > slots {
			t.Errorf("slot %d granted, want 1..%d", slot, slots)
		}
		// In grant order by the database clock, fences increase.
		for i := 1; i < len(ls); i++ {
			for j := range i {
				a, b := ls[j], ls[i]
				if a.acquiredAt.Before(b.acquiredAt) != (a.fence < b.fence) {
					t.Errorf("slot %d: fence %d acquired %s, fence %d acquired %s", slot, a.fence, a.acquiredAt, b.fence, b.acquiredAt)
				}
			}
		}
	}
	if total != clientsN*perClient*rounds {
		t.Errorf("%d grants, want %d", total, clientsN*perClient*rounds)
	}
}

// Fenced writes work per slot: each slot's holder writes with its token;
// once a slot's grant is force-released and granted again, its former
// holder's token is rejected while the other slot's holder still writes.
func TestSemaphoreFencedWrites(t *testing.T) {
	t.Parallel()
	cs, pools := clients(t, 2)
	ctx := testContext(t)
	pool := pools[0]
	if _, err := pool.Exec(ctx, `CREATE TABLE jobs (id int PRIMARY KEY, by text, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if err := fencing.Protect(ctx, pool, "jobs"); err != nil {
		t.Fatal(err)
	}
	sa, _ := cs[0].Semaphore("writers", 2)
	sb, _ := cs[1].Semaphore("writers", 2)
	one, err := sa.Acquire(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	two, err := sa.Acquire(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	write := func(l *Lease, id int) error {
		return fencing.InTx(ctx, pool, l.Token(), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO jobs (id, by) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET by = EXCLUDED.by`, id, l.Name())
			return err
		})
	}
	for _, l := range []*Lease{one, two} {
		if err := write(l, l.Slot()); err != nil {
			t.Fatalf("write by %v: %v", l, err)
		}
	}
	if err := cs[1].ForceRelease(ctx, one.Name()); err != nil {
		t.Fatal(err)
	}
	next, err := sb.Acquire(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if next.Slot() != 1 || next.Fence() <= one.Fence() {
		t.Fatalf("after force-release: slot %d fence %d, want slot 1 above %d", next.Slot(), next.Fence(), one.Fence())
	}
	if err := write(one, 1); !fencing.IsStale(err) {
		t.Errorf("write by the former holder of slot 1 = %v, want stale", err)
	}
	if err := write(next, 1); err != nil {
		t.Errorf("write by the new holder of slot 1: %v", err)
	}
	if err := write(two, 2); err != nil {
		t.Errorf("write by the holder of slot 2: %v", err)
	}
}

// A semaphore and a lease of the same name (a Lead campaign on "shared"
// and workers taking slots of semaphore "shared" — slots "shared#k") are
// different things: a Client's waiter for one must not queue the other's
// waiters behind it. Before, both queued under the name, only the head
// attempted, and a semaphore with every slot free waited as long as the
// campaign did.
func TestSemaphoreDoesNotQueueBehindLeaseOfSameName(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, b := cs[0], cs[1]
	sleeping := make(chan struct{}, 1)
	hookWait(a, func(string) { signal(sleeping) })
	ctx := testContext(t)
	if _, err := b.TryAcquire(ctx, "shared", time.Minute); err != nil {
		t.Fatal(err)
	}
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	campaign := make(chan error, 1)
	go func() {
		_, err := a.Acquire(lctx, "shared", time.Minute)
		campaign <- err
	}()
	select {
	case <-sleeping: // the lease's waiter is head of a's queue, and waits
	case err := <-campaign:
		t.Fatalf("Acquire of the held lease: %v", err)
	case <-ctx.Done():
		t.Fatal("the lease's waiter never waited")
	}
	sem, err := a.Semaphore("shared", 2)
	if err != nil {
		t.Fatal(err)
	}
	// 5s: a free slot is granted in one statement; the lease's waiter
	// waits a minute.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := sem.Acquire(sctx, time.Minute)
	if err != nil {
		t.Fatalf("semaphore Acquire with every slot free, behind a waiter for the lease of its name: %v", err)
	}
	if l.Slot() != 1 {
		t.Errorf("slot %d, want 1", l.Slot())
	}
	stop()
	if err := <-campaign; !errors.Is(err, context.Canceled) {
		t.Errorf("lease's waiter: %v, want context.Canceled", err)
	}
}

// A full semaphore with no live holder: its one slot expired while its
// former holder, paused, still has a fenced transaction open, so the slot
// cannot be granted again yet. TryAcquire matches ErrHeld, but its
// HeldError says what is true — no live holder, the slots are busy — not
// that an owner "" with fence 0 holds the semaphore.
func TestSemaphoreTryAcquireSlotsBusy(t *testing.T) {
	t.Parallel()
	cs, pools := clients(t, 2)
	a, b := freeze(cs[0]), cs[1]
	ctx := testContext(t)
	sa, _ := a.Semaphore("busy", 1)
	sb, _ := b.Semaphore("busy", 1)
	l, err := sa.TryAcquire(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pause(a, l)
	if _, err := pools[0].Exec(ctx, `CREATE TABLE busy_jobs (id int PRIMARY KEY, fence bigint NOT NULL DEFAULT 0)`); err != nil {
		t.Fatal(err)
	}
	if err := fencing.Protect(ctx, pools[0], "busy_jobs"); err != nil {
		t.Fatal(err)
	}
	tx, err := fencing.Begin(ctx, pools[0], l.Token())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO busy_jobs (id) VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	waitExpired(t, pools[1], l.Name())

	_, err = sb.TryAcquire(ctx, time.Minute)
	var held *HeldError
	if !errors.Is(err, ErrHeld) || !errors.As(err, &held) {
		t.Fatalf("TryAcquire with the only slot busy: %v, want a *HeldError", err)
	}
	t.Logf("slots busy: %v", err)
	if held.Holder.Name != "busy" || held.Holder.Owner != "" || held.Holder.Fence != 0 {
		t.Errorf("Holder %+v, want the semaphore's name and no owner", held.Holder)
	}
	if msg := err.Error(); !strings.HasPrefix(msg, `leases: semaphore "busy": `) || !strings.Contains(msg, "no live holder") ||
		strings.Contains(msg, `held by ""`) || strings.Contains(msg, "fence 0") {
		t.Errorf("message %q, want it to say the semaphore has no live holder but no slot free", msg)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	next, err := sb.TryAcquire(ctx, time.Minute)
	if err != nil || next.Slot() != 1 || next.Fence() <= l.Fence() {
		t.Fatalf("TryAcquire once the fenced transaction ended: %v, %v; want slot 1 above fence %d", next, err, l.Fence())
	}
}
