package pglock

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Locks taken and released within the start delay arm the starter's timer
// once, start no monitor, and leave the queue when they come due. A grant
// arms the timer only when it rests, and it rests only after a firing
// found the queue empty: so however slow the machine, the timer is armed
// at most once more than it fired.
func TestStarterArmsOncePerDelay(t *testing.T) {
	t.Parallel()
	_, l := setup(t)
	// Long enough for the 20 cycles on most machines, so that the timer
	// does not fire meanwhile and "armed once" is what is checked; on a
	// loaded one (a cycle took over a second) it fires, rests and is
	// armed again, as it should, and the bound below allows for that.
	const delay = 3 * time.Second
	l.hooks.monitorDelay = delay
	ctx := testContext(t)
	var (
		locks []*Lock
		first time.Time // the first grant
	)
	for i := range 20 {
		lk, err := l.TryLock(ctx, fmt.Sprintf("starter/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			first = time.Now()
		}
		l.starter.mu.Lock()
		arms, fires := l.starter.arms, l.starter.fires
		l.starter.mu.Unlock()
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		locks = append(locks, lk)
		if arms > fires+1 {
			t.Fatalf("lock %d, %v after the first: the starter's timer was armed %d times and fired %d times, want armed at most once more than fired (once, within the %v delay)",
				i, time.Since(first).Round(time.Millisecond), arms, fires, delay)
		}
	}
	for _, lk := range locks {
		if got := lk.monitorState.Load(); got != monitorCancelled {
			t.Fatalf("%s: monitor state %d after Unlock, want cancelled (%d)", lk.Name(), got, monitorCancelled)
		}
	}
	// All came due within the delay: the queue empties and the timer
	// rests.
	pgtest.WaitFor(t, 30*time.Second, "the starter's queue to empty and its timer to rest", func() bool {
		l.starter.mu.Lock()
		defer l.starter.mu.Unlock()
		return len(l.starter.queue) == 0 && !l.starter.armed
	})
}

// Locks taken and released in a loop, for many start delays, make the
// starter's timer fire about once per delay, not once per Lock: an
// unlocked Lock does not re-arm it. Each firing runs a goroutine and can
// wake a thread, which costs a short lock cycle.
func TestStarterFiresOncePerDelayInALoop(t *testing.T) {
	t.Parallel()
	_, l := setup(t)
	const delay = 20 * time.Millisecond
	l.hooks.monitorDelay = delay
	ctx := testContext(t)
	start := time.Now()
	cycles := 0
	for ; cycles < 200 || time.Since(start) < 10*delay; cycles++ {
		lk, err := l.TryLock(ctx, "starter/loop")
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	elapsed := time.Since(start)
	l.starter.mu.Lock()
	fires := l.starter.fires
	l.starter.mu.Unlock()
	// About elapsed/delay firings; twice that and two more, so that a
	// slow machine's late timers do not fail it. Once per Lock would be
	// hundreds.
	if limit := 2*int(elapsed/delay) + 2; fires > limit {
		t.Errorf("%d lock cycles in %v fired the starter's timer %d times, want at most %d (about one per %v delay)",
			cycles, elapsed.Round(time.Millisecond), fires, limit, delay)
	}
}

// Starts racing Unlocks from many goroutines: each Lock's monitor either
// starts and is stopped, or never starts; no Unlock fails, no connection
// is destroyed, and a lock held past the delay is watched.
func TestStarterRacesUnlock(t *testing.T) {
	t.Parallel()
	pool, l := setup(t, WithLivenessCheck(MinLivenessInterval, time.Second))
	l.hooks.monitorDelay = time.Millisecond
	ctx := testContext(t)
	var warm []*pgxpool.Conn // one connection per goroutine, opened now
	for range 4 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		warm = append(warm, c)
	}
	for _, c := range warm {
		c.Release()
	}
	opened := pool.Stat().NewConnsCount()
	var started, cancelled [4]int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			for i := range 100 {
				lk, err := l.Lock(ctx, fmt.Sprintf("race/%d", g))
				if err != nil {
					t.Errorf("Lock %d/%d: %v", g, i, err)
					return
				}
				time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // around the start
				if err := lk.Unlock(ctx); err != nil {
					t.Errorf("Unlock %d/%d: %v", g, i, err)
					return
				}
				mu.Lock()
				switch lk.monitorState.Load() {
				case monitorStarted:
					started[g]++
				case monitorCancelled:
					cancelled[g]++
				default:
					t.Errorf("%d/%d: monitor neither started nor cancelled after Unlock", g, i)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("monitors started %v, cancelled before starting %v", started, cancelled)
	if n := pool.Stat().NewConnsCount(); n != opened {
		t.Errorf("the pool opened %d more connections: an Unlock destroyed one", n-opened)
	}
	var s, c int
	for g := range started {
		s, c = s+started[g], c+cancelled[g]
	}
	if s == 0 || c == 0 {
		t.Errorf("holds of 0-2ms around a 1ms delay must both start and cancel monitors: %d started, %d cancelled", s, c)
	}
	assertIdle(t, pool)
}
