package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/fencing"
	"github.com/pgfence/pgfence/internal/pgtest"
)

const (
	createRaceResults = `CREATE TABLE race_results (
    iter        int PRIMARY KEY,
    a_committed bool   NOT NULL,
    a_stale     bool   NOT NULL,
    a_err       text   NOT NULL,
    b_saw_a     bool   NOT NULL,
    b_fence     bigint NOT NULL,
    final_v     text   NOT NULL,
    final_fence bigint NOT NULL)`
	insertRaceResult = `INSERT INTO race_results VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
	// Each row is a violation of the guarantee.
	raceViolations = `
SELECT iter, CASE
         WHEN a_committed AND NOT b_saw_a THEN 'A committed after B was granted (B did not see it)'
         WHEN NOT a_committed AND NOT a_stale THEN 'A failed other than as stale: ' || a_err
         WHEN final_v <> 'B' OR final_fence <> b_fence THEN 'B''s write is not the last one'
       END
  FROM race_results
 WHERE (a_committed AND NOT b_saw_a) OR (NOT a_committed AND NOT a_stale)
    OR final_v <> 'B' OR final_fence <> b_fence
 ORDER BY iter`
	raceOutcomes = `SELECT count(*) FILTER (WHERE a_committed), count(*) FILTER (WHERE NOT a_committed) FROM race_results`
)

// TestTakeoverRace races a takeover against an in-flight fenced
// transaction, many times concurrently. A holds a short lease, writes its row
// (sometimes after the lease has already expired), and keeps the transaction
// open past the expiry; B polls for the lease, and once granted reads the row
// and overwrites it. Either A's transaction commits before B is granted — so
// B, reading after its grant, sees A's write — or A is rejected as stale.
// Never both: A committing after B's grant would mean two holders' writes
// interleaved. Without the guard's share lock on the lease row, B would be
// granted while A's transaction is open, read the old value, and A would
// commit afterwards.
func TestTakeoverRace(t *testing.T) {
	t.Parallel()
	takeoverRace(t, nil)
}

// takeoverRace runs the race on a fresh database; prepare, if not nil, runs
// on the database first.
func takeoverRace(t *testing.T, prepare func(*pgxpool.Pool)) {
	pool := pgtest.PoolFor(t, pgtest.URL(t), func(c *pgxpool.Config) { c.MaxConns = 32 })
	mustExec(t, pool, createItems)
	if err := fencing.Protect(bg, pool, "items"); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, createRaceResults)
	if prepare != nil {
		prepare(pool)
	}

	const iterations, workers = 120, 10
	ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
	defer cancel()
	iters := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for i := range iters {
				if err := raceOnce(ctx, pool, i); err != nil {
					errs <- fmt.Errorf("iteration %d: %w", i, err)
					return
				}
			}
		})
	}
	go func() {
		defer close(iters)
		for i := range iterations {
			select {
			case iters <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		cancel() // let the feeder exit
		t.Fatal(err)
	}

	rows, _ := pool.Query(bg, raceViolations)
	type violation struct {
		Iter int
		Why  string
	}
	bad, err := pgx.CollectRows(rows, pgx.RowToStructByPos[violation])
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range bad {
		t.Errorf("iteration %d: %s", v.Iter, v.Why)
	}
	var committed, rejected int
	if err := pool.QueryRow(bg, raceOutcomes).Scan(&committed, &rejected); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d iterations: A committed before the takeover %d times, was rejected as stale %d times", iterations, committed, rejected)
	if committed+rejected != iterations {
		t.Fatalf("%d results recorded, want %d", committed+rejected, iterations)
	}
	// Both outcomes must occur, or the test proved nothing about the race.
	// A writes 0-200ms into a 150ms lease, so roughly half its writes land
	// in time and half after expiry even on a slow, loaded machine (with a
	// 30ms lease, a loaded CI machine once saw none of A's 120 writes land
	// in time: its grant and BEGIN took longer than the lease).
	if committed == 0 || rejected == 0 {
		t.Fatalf("only one outcome occurred (committed %d, rejected %d): the race was not exercised", committed, rejected)
	}
}

// raceTTL is A's lease in the race: A's write and commit land before and
// after its expiry.
const raceTTL = 150 * time.Millisecond

// raceOnce runs one iteration on its own lease and row, and records it.
func raceOnce(ctx context.Context, pool *pgxpool.Pool, i int) error {
	name := fmt.Sprintf("race-%d", i)
	a, ok, err := tryGrant(ctx, pool, name, raceTTL)
	if err != nil || !ok {
		return fmt.Errorf("grant A: ok=%v: %w", ok, err)
	}
	var (
		wg         sync.WaitGroup
		aErr, bErr error
		bTok       fencing.Token
		bSawA      bool
	)
	wg.Go(func() {
		// A pauses before writing (0-200ms), then holds its transaction
		// open (0-200ms) — both can outlast the lease.
		time.Sleep(time.Duration(i%5) * raceTTL / 3)
		aErr = fencing.InTx(ctx, pool, a, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, upsertItem, i, "A"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, (time.Duration(i%3) * raceTTL * 2 / 3).Seconds())
			return err
		})
	})
	wg.Go(func() {
		// B polls for the lease the way a waiting acquirer does; a grant
		// attempt that meets A's share lock blocks until A's transaction
		// ends.
		for {
			tok, ok, err := tryGrant(ctx, pool, name, time.Minute)
			if err != nil {
				bErr = fmt.Errorf("grant B: %w", err)
				return
			}
			if ok {
				bTok = tok
				break
			}
			select {
			case <-time.After(time.Millisecond):
			case <-ctx.Done():
				bErr = ctx.Err()
				return
			}
		}
		bErr = fencing.InTx(ctx, pool, bTok, func(tx pgx.Tx) error {
			var v string
			err := tx.QueryRow(ctx, `SELECT v FROM items WHERE id = $1`, i).Scan(&v)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			bSawA = v == "A"
			_, err = tx.Exec(ctx, upsertItem, i, "B")
			return err
		})
	})
	wg.Wait()
	if bErr != nil {
		return fmt.Errorf("B: %w", bErr)
	}
	aErrText := ""
	if aErr != nil {
		aErrText = aErr.Error()
	}
	var finalV string
	var finalFence int64
	if err := pool.QueryRow(ctx, selectItem, i).Scan(&finalV, &finalFence); err != nil {
		return fmt.Errorf("read final row: %w", err)
	}
	_, err = pool.Exec(ctx, insertRaceResult, i, aErr == nil, errors.Is(aErr, fencing.ErrStale), aErrText, bSawA, bTok.Fence, finalV, finalFence)
	return err
}
