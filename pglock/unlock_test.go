package pglock

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// If PostgreSQL says the session did not hold the lock (someone released it
// behind pglock's back), Unlock reports it and destroys the connection.
func TestUnlockFalseDestroysConnection(t *testing.T) {
	t.Parallel()
	// The monitor waits its start delay (an hour) until Unlock, and does not
	// touch the connection meanwhile: the test may.
	pool, l := setup(t, WithLivenessCheck(time.Hour, time.Second))
	l.hooks.monitorDelay = time.Hour
	ctx := testContext(t)
	lk, err := l.Lock(ctx, "tampered")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lk.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
		t.Fatal(err)
	}
	total := pool.Stat().TotalConns()
	if err := lk.Unlock(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("Unlock of a lock the session no longer held = %v, want ErrLost", err)
	}
	if lk.Err() != ErrLost {
		t.Errorf("Err = %v, want ErrLost", lk.Err())
	}
	if got := pool.Stat().TotalConns(); got != total-1 {
		t.Errorf("total connections = %d, want %d: the connection must be destroyed", got, total-1)
	}
	if poolPIDs(t, pool)[lk.pid] {
		t.Errorf("backend %d is still in the pool", lk.pid)
	}
	assertIdle(t, pool)
}

// Unlock at any moment of the monitor's life (waiting to start, watching,
// probing, between the two) returns the connection cleanly: it cuts a
// watch short but waits for a probe, which a cut would break (pgconn
// closes a connection whose reply it stopped reading). With a 10ms
// liveness interval and no start delay, holds of 0 to 15ms land in every
// phase; no Unlock may fail and no connection may be destroyed.
func TestUnlockDuringMonitorPhases(t *testing.T) {
	t.Parallel()
	pool, l := setup(t, WithLivenessCheck(MinLivenessInterval, time.Second))
	l.hooks.monitorDelay = 0
	ctx := testContext(t)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	const rounds = 200
	opened := int64(-1)
	for i := range rounds {
		lk, err := l.Lock(ctx, "phases")
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			opened = pool.Stat().NewConnsCount()
		}
		time.Sleep(time.Duration(rng.IntN(15000)) * time.Microsecond) // the hold, ending in a random phase
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("Unlock %d: %v", i, err)
		}
	}
	if n := pool.Stat().NewConnsCount(); n != opened {
		t.Errorf("the pool opened %d connections after the first, want none: an Unlock destroyed one", n-opened)
	}
	assertIdle(t, pool)
}
