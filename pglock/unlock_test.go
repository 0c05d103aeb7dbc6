package pglock

import (
	"errors"
	"testing"
)

// If PostgreSQL says the session did not hold the lock (someone released it
// behind pglock's back), Unlock reports it and destroys the connection.
func TestUnlockFalseDestroysConnection(t *testing.T) {
	t.Parallel()
	pool, l := setup(t)
	ctx := testContext(t)
	lk, err := l.Lock(ctx, "tampered")
	if err != nil {
		t.Fatal(err)
	}
	lk.stopMonitor() // take the connection from the monitor, as Unlock does
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
