package leases

import (
	"errors"
	"testing"
	"time"
)

// The promise (docs/primitives.md, "Semaphores"): a caller counts only the
// slots 1..N of its own N. A caller of 2 slots never takes slot 3, which
// a caller of 3 may hold or leave free; and it finds its own slots full
// exactly when slots 1 and 2 are held.
func TestSemaphoreCountsOnlyItsOwnSlots(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	ctx := testContext(t)
	three, err := cs[0].Semaphore("own/n", 3)
	if err != nil {
		t.Fatal(err)
	}
	two, err := cs[1].Semaphore("own/n", 2)
	if err != nil {
		t.Fatal(err)
	}
	var slots []*Lease
	for range 3 {
		l, err := three.TryAcquire(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, l)
	}
	if err := slots[2].Release(ctx); err != nil { // own/n#3 is free now
		t.Fatal(err)
	}
	if l, err := two.TryAcquire(ctx, time.Minute); !errors.Is(err, ErrHeld) {
		name := ""
		if l != nil {
			name = l.Name()
		}
		t.Errorf("a 2-slot TryAcquire with slots 1 and 2 held and 3 free = %q, %v; want ErrHeld", name, err)
	}
	if err := slots[0].Release(ctx); err != nil { // own/n#1 is free now
		t.Fatal(err)
	}
	l, err := two.TryAcquire(ctx, time.Minute)
	if err != nil {
		t.Fatalf("a 2-slot TryAcquire with slot 1 free: %v", err)
	}
	if l.Name() != "own/n#1" {
		t.Errorf("a 2-slot TryAcquire took %s, want own/n#1", l.Name())
	}
}
