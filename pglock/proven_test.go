package pglock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgcluster"
	"github.com/pgfence/pgfence/internal/pgtest"
)

// statementLog is a pgx QueryTracer that records the SQL of every
// statement a pool sends, in order.
type statementLog struct {
	mu  sync.Mutex
	sql []string
}

func (s *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, data.SQL)
	return ctx
}

func (s *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// take returns the statements recorded since the last take.
func (s *statementLog) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := s.sql
	s.sql = nil
	return got
}

// tracedPool opens a pool of one connection over u whose statements log
// records; opts adjust it further.
func tracedPool(t *testing.T, u string, log *statementLog, opts ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolFor(t, u, append([]func(*pgxpool.Config){func(c *pgxpool.Config) {
		c.MaxConns = 1
		c.ConnConfig.Tracer = log
	}}, opts...)...)
}

// TestProvenSession: the first acquire on a direct connection runs the
// statement with the pid and standby checks; every later acquire of one
// key on that connection runs the one without them, and still excludes
// other sessions; a new connection starts over. In each of pgx's exec
// modes, which send the statements' arguments differently.
func TestProvenSession(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	other := newLocker(t, newPool(t, u, 2))
	for _, mode := range pgtest.ExecModes {
		t.Run(mode.String(), func(t *testing.T) {
			testProvenSession(t, u, mode, other)
		})
	}
}

func testProvenSession(t *testing.T, u string, mode pgx.QueryExecMode, other *Locker) {
	ctx := testContext(t)
	log := &statementLog{}
	pool := tracedPool(t, u, log, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
	l := newLocker(t, pool)
	log.take() // the pool's ping

	cycle := func(what string, acquire func(context.Context, string) (*Lock, error), conflicts func(context.Context, string) (*Lock, error), want string) {
		t.Helper()
		name := "proven/" + mode.String() + "/" + what
		lk, err := acquire(ctx, name)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got := log.take(); len(got) != 1 || got[0] != want {
			t.Errorf("%s sent %q, want only %q", what, got, want)
		}
		if got := holders(t, connect(t, u), Key(name), map[bool]string{false: "ExclusiveLock", true: "ShareLock"}[lk.shared]); !slices.Equal(got, []int32{int32(lk.pid)}) {
			t.Errorf("%s: holders %v, want the Lock's backend %d", what, got, lk.pid)
		}
		if c, err := conflicts(ctx, name); !errors.Is(err, ErrLocked) {
			t.Errorf("%s: a conflicting try from another session = %v, %v; want ErrLocked", what, c, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("%s: unlock: %v", what, err)
		}
		log.take()
	}

	cycle("first TryLock", l.TryLock, other.TryLock, sqlTryLock)
	cycle("TryLock", l.TryLock, other.TryLock, sqlTryLockProven)
	cycle("TryRLock", l.TryRLock, other.TryLock, sqlTryLockSharedProven)
	cycle("Lock", l.Lock, other.TryRLock, sqlLockProven)
	cycle("RLock", l.RLock, other.TryLock, sqlLockSharedProven)

	// A set of names runs the statement of sets, which keeps its checks.
	set, err := l.TryLockAll(ctx, "proven/"+mode.String()+"/a", "proven/"+mode.String()+"/b")
	if err != nil {
		t.Fatalf("TryLockAll: %v", err)
	}
	if got := log.take(); len(got) != 1 || got[0] != sqlTryLockAll {
		t.Errorf("TryLockAll sent %q, want only sqlTryLockAll", got)
	}
	if err := set.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// A new connection is not proven.
	pool.Reset()
	log.take()
	cycle("TryLock on a new connection", l.TryLock, other.TryLock, sqlTryLock)
	cycle("TryLock again", l.TryLock, other.TryLock, sqlTryLockProven)
	assertIdle(t, pool)
}

// TestSessionPoolerNeverProven: through a pooler, whose backend keys are
// its own, the pid never matches, so every acquire keeps both checks and
// the session check after the grant.
func TestSessionPoolerNeverProven(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	bu := behindBouncer(t, u, pgcluster.SessionPooling)
	ctx := testContext(t)
	log := &statementLog{}
	pool := tracedPool(t, bu, log)
	l := newLocker(t, pool)
	log.take()
	for i := range 3 {
		lk, err := l.TryLock(ctx, "proven/pooler")
		if err != nil {
			t.Fatalf("TryLock %d through a session pooler: %v", i, err)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("unlock %d: %v", i, err)
		}
		want := []string{sqlTryLock, sqlVerifySession, sqlUnlock}
		if got := log.take(); !slices.Equal(got, want) {
			t.Errorf("cycle %d sent %q, want %q", i, got, want)
		}
	}
	assertIdle(t, pool)
}
