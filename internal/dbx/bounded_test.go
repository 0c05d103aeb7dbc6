package dbx

import (
	"context"
	"errors"
	"testing"
	"time"
)

// bounded returns f's outcome when f returns first, ctx's error at once
// when ctx ends first — while f still runs, as a driver that ignores its
// context does — and then hands f's late outcome to drop.
func TestBounded(t *testing.T) {
	t.Parallel()
	v, err := bounded(context.Background(), func() (int, error) { return 7, nil }, nil)
	if v != 7 || err != nil {
		t.Errorf("bounded with a context that never ends = %d, %v; want 7, nil", v, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	dropped := make(chan int, 1)
	cancel() // f blocks until release: the context ends first
	v, err = bounded(ctx, func() (int, error) { <-release; return 42, nil }, func(v int) { dropped <- v })
	if v != 0 || !errors.Is(err, context.Canceled) {
		t.Errorf("bounded after ctx ended = %d, %v; want 0, context.Canceled", v, err)
	}
	close(release)
	select {
	case got := <-dropped:
		if got != 42 {
			t.Errorf("drop got %d, want 42", got)
		}
	case <-time.After(10 * time.Second):
		t.Error("drop was not called after f returned")
	}
}
