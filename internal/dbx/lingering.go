package dbx

import (
	"context"
	"sync"
)

// Lingering counts goroutines that outlive the call that started them: a
// statement left running when its caller's context ended (bounded), and
// what gives its connection back once it ends. Its owner waits for them
// when it closes, so that none holds a connection past it. The zero value
// is ready; a nil *Lingering runs its goroutines uncounted.
type Lingering struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0
}

// Go runs f in a goroutine counted until f returns.
func (g *Lingering) Go(f func()) {
	if g == nil {
		go f()
		return
	}
	g.mu.Lock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
	go func() {
		defer g.done()
		f()
	}()
}

func (g *Lingering) done() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 {
		close(g.idle)
	}
}

// Wait waits until none of g's goroutines runs, or ctx ends, and returns
// how many still run.
func (g *Lingering) Wait(ctx context.Context) int {
	if g == nil {
		return 0
	}
	g.mu.Lock()
	n, idle := g.n, g.idle
	g.mu.Unlock()
	if n == 0 {
		return 0
	}
	select {
	case <-idle:
		return 0
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.n
	}
}

// LingeringOf returns what q counts of its statements left running: those
// of SQL over a *sql.DB; nil for any other Querier, whose statements end
// when their contexts do.
func LingeringOf(q Querier) *Lingering {
	if dq, ok := q.(dbQuerier); ok {
		return dq.lingering
	}
	return nil
}
