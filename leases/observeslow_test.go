package leases

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// statementEnd is a pgx tracer that calls ended with the error of each
// statement whose SQL is sql, once it has returned.
type statementEnd struct {
	sql   string
	ended func(error)
}

type statementEndKey struct{}

func (s statementEnd) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == s.sql {
		return context.WithValue(ctx, statementEndKey{}, true)
	}
	return ctx
}

func (s statementEnd) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(statementEndKey{}) != nil {
		s.ended(d.Err)
	}
}

// Observe's values are not queued: a reader that takes a value after the
// observer has read a newer state gets the newer one — not the oldest it
// missed — as Observe's documentation promises. Before, the observer
// blocked on the value the reader had not taken yet and handed it over,
// stale, and read nothing meanwhile.
func TestObserveSlowReaderSeesLatest(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	reads := make(chan struct{}, 100)
	pool := pgtest.PoolFor(t, url, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = statementEnd{sqlGet, func(error) { reads <- struct{}{} }}
	})
	// Polls no sooner than the holder's expiry (a minute): only the
	// notifications of SetData wake the observer.
	c := newClient(t, pool, WithPollInterval(time.Hour))
	b := newClient(t, pgtest.PoolFor(t, url))
	ctx := testContext(t)
	read := func(what string) {
		t.Helper()
		select {
		case <-reads:
		case <-ctx.Done():
			t.Fatalf("the observer did not read the lease %s", what)
		}
	}
	l, err := b.TryAcquire(ctx, "watched", time.Minute, WithData(json.RawMessage(`1`)))
	if err != nil {
		t.Fatal(err)
	}
	waitListening(t, c) // so that the observer holds the name's wait key
	ch, err := c.Observe(ctx, "watched")
	if err != nil {
		t.Fatal(err)
	}
	if first := <-ch; string(first.Data) != `1` {
		t.Fatalf("first value: %+v, want data 1", first)
	}
	read("at first")
	for _, v := range []string{`2`, `3`} { // 2 waits in the channel; 3 is newer
		if err := l.SetData(ctx, json.RawMessage(v)); err != nil {
			t.Fatal(err)
		}
		read("after SetData " + v)
	}
	// One more wake-up: the observer reads again once it has handed 3
	// over. Bounded by 5s (a round trip; the observer before never read
	// again), after which the reader takes a value regardless.
	if err := l.SetData(ctx, json.RawMessage(`3`)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reads:
	case <-time.After(5 * time.Second):
		t.Log("the observer did not read again within 5s")
	}
	select {
	case info := <-ch:
		if string(info.Data) != `3` {
			t.Errorf("slow reader got data %s, want the latest, 3", info.Data)
		}
	case <-ctx.Done():
		t.Fatal("no value")
	}
}
