package pgfencetest

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
)

// recorder is a testing.TB that is t but for Fatalf, Errorf and Cleanup:
// it records the messages and the cleanups instead of failing t, so that a
// test can check what a helper does when it fails, and after.
type recorder struct {
	testing.TB
	mu       sync.Mutex
	fatal    string
	errors   []string
	cleanups []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatal = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// run calls f on a goroutine of its own, as the testing package runs a
// test (Fatalf ends it), then the cleanups f registered, the last first.
func (r *recorder) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
}
