package dbx

import (
	"context"
	"errors"
	"testing"
	"time"
)

// bounded returns f's outcome when f returns first, ctx's error at once
// when ctx ends first — while f still runs, as a driver that ignores its
// context does — and then hands f's late outcome to drop; its Lingering
// counts f until drop has returned.
func TestBounded(t *testing.T) {
	t.Parallel()
	var g Lingering
	v, err := bounded(context.Background(), &g, func() (int, error) { return 7, nil }, nil)
	if v != 7 || err != nil {
		t.Errorf("bounded with a context that never ends = %d, %v; want 7, nil", v, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	dropped := make(chan int, 1)
	cancel() // f blocks until release: the context ends first
	v, err = bounded(ctx, &g, func() (int, error) { <-release; return 42, nil }, func(v int) { dropped <- v })
	if v != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("bounded after ctx ended = %d, %v; want 0, context.Canceled", v, err)
	}
	if n := g.Wait(ctx); n != 1 { // ctx has ended: Wait reports at once
		t.Errorf("Wait while f runs = %d; want 1", n)
	}
	close(release)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if n := g.Wait(wctx); n != 0 {
		t.Errorf("Wait after f returned = %d; want 0", n)
	}
	select {
	case got := <-dropped: // drop ran before Wait returned
		if got != 42 {
			t.Errorf("drop got %d, want 42", got)
		}
	default:
		t.Error("Wait returned before drop was called")
	}
}

// A Lingering counts each goroutine until it returns, across bursts, and
// a nil one runs them uncounted.
func TestLingering(t *testing.T) {
	t.Parallel()
	var g Lingering
	ended, end := context.WithCancel(context.Background())
	end()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n := g.Wait(ended); n != 0 {
		t.Errorf("Wait with none started = %d; want 0", n)
	}
	for round := range 2 {
		release := make(chan struct{})
		for range 3 {
			g.Go(func() { <-release })
		}
		done, stop := context.WithCancel(ctx)
		stop()
		if n := g.Wait(done); n != 3 {
			t.Errorf("round %d: Wait with 3 running = %d; want 3", round, n)
		}
		close(release)
		if n := g.Wait(ctx); n != 0 {
			t.Errorf("round %d: Wait after they returned = %d; want 0", round, n)
		}
	}
	var nilG *Lingering
	ran := make(chan struct{})
	nilG.Go(func() { close(ran) })
	<-ran
	if n := nilG.Wait(ctx); n != 0 {
		t.Errorf("nil Lingering's Wait = %d; want 0", n)
	}
}
