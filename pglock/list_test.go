package pglock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// List and Get show holders and waiters with their sessions; a refused
// TryLock names the same holders.
func TestListGetAndHeldError(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.PoolFor(t, url, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["application_name"] = "pglock-list-test"
	})
	l := newLocker(t, pool)
	ctx := testContext(t)

	if got, err := l.List(ctx); err != nil || len(got) != 0 {
		t.Fatalf("List with no locks = %v, %v; want an empty slice", got, err)
	}
	a, err := l.RLock(ctx, "list/shared")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Unlock(ctx)
	b, err := l.RLock(ctx, "list/shared")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unlock(ctx)
	ex, err := l.Lock(ctx, "list/exclusive")
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Unlock(ctx)

	// A waiter on the exclusive lock.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		lk, err := l.Lock(wctx, "list/exclusive")
		if err == nil {
			err = lk.Unlock(ctx)
		}
		waited <- err
	}()
	pgtest.WaitFor(t, 10*time.Second, "the waiter to queue", func() bool {
		infos, err := l.Get(ctx, "list/exclusive")
		return err == nil && len(infos) == 2
	})

	infos, err := l.Get(ctx, "list/exclusive")
	if err != nil {
		t.Fatal(err)
	}
	h, w := infos[0], infos[1]
	if h.Key != Key("list/exclusive") || !h.Granted || h.Shared || h.PID != int32(ex.pid) ||
		h.ApplicationName != "pglock-list-test" || h.ClientAddr == "" || h.BackendStart.IsZero() || // 127.0.0.1, or Docker's gateway
		h.StateChange.IsZero() || !h.WaitStart.IsZero() || h.ReadAt.Before(h.BackendStart) {
		t.Errorf("holder = %+v", h)
	}
	if w.Key != h.Key || w.Granted || w.WaitStart.IsZero() || w.PID == h.PID || w.State != "active" {
		t.Errorf("waiter = %+v", w)
	}
	all, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Errorf("List = %d rows, want 4 (two shared holders, a holder and a waiter): %+v", len(all), all)
	}
	if got, err := l.Get(ctx, "list/none"); err != nil || got == nil || len(got) != 0 {
		t.Errorf("Get of a free lock = %#v, %v; want an empty slice", got, err)
	}

	// Refused tries name the holders: both shared ones, or the exclusive one.
	cases := []struct {
		name    string
		try     func(context.Context, string) (*Lock, error)
		holders map[int32]bool
	}{
		{"list/shared", l.TryLock, map[int32]bool{int32(a.pid): true, int32(b.pid): true}},
		{"list/exclusive", l.TryRLock, map[int32]bool{int32(ex.pid): true}},
	}
	for _, c := range cases {
		lk, err := c.try(ctx, c.name)
		var he *HeldError
		if lk != nil || !errors.As(err, &he) || !errors.Is(err, ErrLocked) {
			t.Fatalf("try %s = %v, %v; want a *HeldError matching ErrLocked", c.name, lk, err)
		}
		if he.Name != c.name || he.Key != Key(c.name) || len(he.Holders) != len(c.holders) {
			t.Errorf("HeldError = %+v", he)
		}
		for _, hi := range he.Holders {
			if !c.holders[hi.PID] || !hi.Granted || hi.ApplicationName != "pglock-list-test" {
				t.Errorf("holder %+v is not one of %v", hi, c.holders)
			}
			if !strings.Contains(err.Error(), `application "pglock-list-test"`) {
				t.Errorf("HeldError text %q does not name the holder's application", err)
			}
		}
		if strings.Count(err.Error(), "pglock:") != 1 {
			t.Errorf("HeldError text %q", err)
		}
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled waiter = %v", err)
	}
}

// Every error's text starts with "pglock: " exactly once, however it was
// wrapped: sentinels are short and each wrap adds context once.
func TestErrorTextComposes(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	lk, err := l.Lock(ctx, "compose")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(lk.pid)); err != nil {
		t.Fatal(err)
	}
	<-lk.Done()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, cancelErr := l.Lock(cancelled, "compose")
	for _, c := range []struct {
		err  error
		want string
	}{
		{lk.Unlock(ctx), `pglock: unlock "compose": lock lost`},
		{lk.Err(), `pglock: lock lost`},
		{cancelErr, `pglock: lock "compose": context canceled`},
		{opErr("lock", "x", ErrStandby), `pglock: lock "x": server is a standby (in recovery)`},
		{opErr("lock", "x", ErrPooler), `pglock: lock "x": transaction-mode pooler`},
		{opErr("lock", "x", errors.New("pgx says no")), `pglock: lock "x": pgx says no`},
		{lockSet{names: []string{"a", "b"}}.opErr("lock all", ErrStandby), `pglock: lock all ["a" "b"]: server is a standby (in recovery)`},
		{lockSet{names: []string{"1", "2", "3", "4", "5", "6", "7"}}.opErr("lock all", ErrStandby), `pglock: lock all ["1" "2" "3" "4" "5" and 2 more]: server is a standby (in recovery)`},
		{&HeldError{Name: "x"}, `pglock: lock "x" held by another session`},
	} {
		if c.err == nil || c.err.Error() != c.want {
			t.Errorf("error = %v, want %q", c.err, c.want)
		}
	}
	assertIdle(t, pool)
}
