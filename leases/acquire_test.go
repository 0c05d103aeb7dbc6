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
)

func TestTryAcquireHeldNamesHolder(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	la, err := a.TryAcquire(ctx, "app/job", time.Minute)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if la.Name() != "app/job" || la.Fence() <= 0 || la.Token().Fence != la.Fence() || la.Token().Lease != "app/job" {
		t.Errorf("lease = %v, token %+v", la, la.Token())
	}
	_, err = b.TryAcquire(ctx, "app/job", time.Minute)
	if !errors.Is(err, ErrHeld) {
		t.Fatalf("second TryAcquire = %v, want ErrHeld", err)
	}
	var held *HeldError
	if !errors.As(err, &held) {
		t.Fatalf("second TryAcquire = %T, want *HeldError", err)
	}
	if held.Holder.Owner != la.Owner() || held.Holder.Fence != la.Fence() || !held.Holder.ExpiresAt.Equal(la.ExpiresAt()) {
		t.Errorf("HeldError.Holder = %+v, want owner %q fence %d expires %s", held.Holder, la.Owner(), la.Fence(), la.ExpiresAt())
	}
	if !strings.Contains(err.Error(), la.Owner()) {
		t.Errorf("error %q does not name the holder", err)
	}
	// The same client cannot take it twice either.
	if _, err := a.TryAcquire(ctx, "app/job", time.Minute); !errors.Is(err, ErrHeld) {
		t.Errorf("TryAcquire by the holder's client = %v, want ErrHeld", err)
	}
	info, err := b.Get(ctx, "app/job")
	if err != nil || info.Owner != la.Owner() || info.Fence != la.Fence() {
		t.Errorf("Get = %+v, %v; want the holder", info, err)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Fence != la.Fence() {
		t.Errorf("List = %+v, %v; want the one grant", list, err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := b.Get(ctx, "app/job"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Get after release = %v, want ErrNotHeld", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Errorf("second Release = %v, want nil (safe to repeat)", err)
	}
	if !errors.Is(la.Err(), ErrReleased) || !errors.Is(context.Cause(la.Context()), ErrReleased) {
		t.Errorf("after Release: Err = %v, cause = %v; want ErrReleased", la.Err(), context.Cause(la.Context()))
	}
}

func TestOwnersUniquePerGrant(t *testing.T) {
	t.Parallel()
	c, _ := setup(t, WithOwner("billing"))
	ctx := testContext(t)
	seen := map[string]bool{}
	for i := range 5 {
		l, err := c.TryAcquire(ctx, fmt.Sprintf("n%d", i%2), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(l.Owner(), "billing-") || len(l.Owner()) != len("billing-")+16 {
			t.Errorf("owner %q, want billing-<16 hex digits>", l.Owner())
		}
		if seen[l.Owner()] {
			t.Errorf("owner %q reused", l.Owner())
		}
		seen[l.Owner()] = true
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Fences strictly increase across grant, release, expiry and force-release.
func TestFencesIncrease(t *testing.T) {
	t.Parallel()
	cs, ps := clients(t, 2)
	a, frozen := cs[0], freeze(newClient(t, ps[1]))
	ctx := testContext(t)
	var fences []int64
	take := func(c *Client, ttl time.Duration) *Lease {
		t.Helper()
		l, err := c.Acquire(ctx, "f", ttl)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		fences = append(fences, l.Fence())
		return l
	}
	// Held until released or force-released: a TTL of a second, renewed
	// every third of it, ran out first on a loaded machine ("lease not
	// held"). Only the frozen holder's is short, to expire.
	l := take(a, time.Minute)
	if err := l.Release(ctx); err != nil { // release
		t.Fatal(err)
	}
	take(frozen, time.Second) // expiry: never renewed
	l = take(a, time.Minute)
	if err := cs[1].ForceRelease(ctx, "f"); err != nil { // force-release
		t.Fatal(err)
	}
	take(cs[1], time.Minute)
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences %v do not strictly increase", fences)
		}
	}
	select {
	case <-l.Done():
	case <-ctx.Done():
		t.Fatal("force-released holder never learned of it")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Errorf("force-released lease Err = %v, want ErrLost", l.Err())
	}
	if err := cs[0].ForceRelease(ctx, "nobody"); !errors.Is(err, ErrNotHeld) {
		t.Errorf("ForceRelease of a free lease = %v, want ErrNotHeld", err)
	}
}

// Many goroutines on several clients (as on several replicas) contend for
// one lease: never two holders, and fences increase in grant order.
func TestExclusiveAcrossGoroutines(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 3, WithPollInterval(time.Second))
	ctx := testContext(t)
	var inside atomic.Int32
	var mu sync.Mutex
	var fences []int64
	var wg sync.WaitGroup
	for i := range 12 {
		c := cs[i%len(cs)]
		wg.Go(func() {
			for range 5 {
				err := c.Run(ctx, "exclusive", 5*time.Second, func(ctx context.Context, l *Lease) error {
					if n := inside.Add(1); n != 1 {
						t.Errorf("%d holders at once", n)
					}
					mu.Lock()
					fences = append(fences, l.Fence())
					mu.Unlock()
					time.Sleep(time.Millisecond) // hold it a moment: widen any overlap
					inside.Add(-1)
					return nil
				})
				if err != nil {
					t.Errorf("Run: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if len(fences) != 60 {
		t.Fatalf("%d grants, want 60", len(fences))
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d after %d: grants out of fence order", fences[i], fences[i-1])
		}
	}
}

func TestKeepaliveRenews(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	ctx := testContext(t)
	// TTL 2s: the keepalive renews every 667ms, and only a renewal
	// stalled for over a second (not a loaded CI machine's 0.6s) loses it.
	const ttl = 2 * time.Second
	l, err := c.TryAcquire(ctx, "kept", ttl)
	if err != nil {
		t.Fatal(err)
	}
	first := l.ExpiresAt()
	// Three TTLs: without renewals the lease would be lost by now.
	timer := time.NewTimer(3 * ttl)
	select {
	case <-l.Done():
		t.Fatalf("lease lost while the keepalive was running: %v", l.Err())
	case <-timer.C:
	}
	if !l.ExpiresAt().After(first.Add(ttl)) {
		t.Errorf("ExpiresAt %s, want well after the first %s", l.ExpiresAt(), first)
	}
	var fence int64
	var expiresAt time.Time
	if err := pool.QueryRow(ctx, "SELECT fence, expires_at FROM pgfence.leases WHERE name = 'kept'").Scan(&fence, &expiresAt); err != nil {
		t.Fatal(err)
	}
	if fence != l.Fence() || expiresAt.Before(l.ExpiresAt()) {
		t.Errorf("row fence %d expires %s; lease fence %d expires %s", fence, expiresAt, l.Fence(), l.ExpiresAt())
	}
	if err := l.Renew(ctx); err != nil {
		t.Errorf("Renew: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("Release: %v", err)
	}
	if err := l.Renew(ctx); !errors.Is(err, ErrReleased) {
		t.Errorf("Renew after Release = %v, want ErrReleased", err)
	}
}

// A renewal that finds the grant gone loses the lease at once, and Release
// and Renew then say so.
func TestRenewFindsGrantGone(t *testing.T) {
	t.Parallel()
	c, pool := setup(t)
	freeze(c)
	ctx := testContext(t)
	l, err := c.TryAcquire(ctx, "gone", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM pgfence.leases"); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("Renew of a deleted grant = %v, want ErrLost", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("lease context not cancelled after a renewal found no row")
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("Release of a lost lease = %v, want ErrLost", err)
	}
}

func TestCloseReleasesAndStops(t *testing.T) {
	t.Parallel()
	cs, _ := clients(t, 2)
	a, b := cs[0], cs[1]
	ctx := testContext(t)
	l1, err := a.TryAcquire(ctx, "c1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := a.TryAcquire(ctx, "c2", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "c3", time.Minute); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		_, err := a.Acquire(ctx, "c3", time.Minute)
		waited <- err
	}()
	obs, err := a.Observe(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	<-obs // the observer goroutine is running
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, l := range []*Lease{l1, l2} {
		if !errors.Is(l.Err(), ErrReleased) || !errors.Is(l.Err(), ErrClosed) {
			t.Errorf("%v after Close: Err = %v, want ErrReleased and ErrClosed", l, l.Err())
		}
		if err := l.Release(ctx); err != nil {
			t.Errorf("Release after Close = %v, want nil", err)
		}
	}
	if err := <-waited; !errors.Is(err, ErrClosed) {
		t.Errorf("waiting Acquire after Close = %v, want ErrClosed", err)
	}
	for range obs {
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "c3" {
		t.Errorf("List after Close = %+v, %v; want only b's c3", list, err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if _, err := a.TryAcquire(ctx, "c1", time.Minute); !errors.Is(err, ErrClosed) {
		t.Errorf("TryAcquire after Close = %v, want ErrClosed", err)
	}
	if _, err := a.Observe(ctx, "c1"); !errors.Is(err, ErrClosed) {
		t.Errorf("Observe after Close = %v, want ErrClosed", err)
	}
}
