package pglock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// Environment of the helper process (TestHelperProcess).
const (
	helperEnv    = "PGLOCK_TEST_HELPER" // set: run as a helper
	helperURL    = "PGLOCK_TEST_URL"
	helperMarker = "PGLOCK_TEST_MARKER"
	helperRounds = "PGLOCK_TEST_ROUNDS"
	// set: hold these names (newline-separated) by LockAll until killed
	helperHoldAll = "PGLOCK_TEST_HOLD_ALL"
)

// Separate OS processes (and goroutines beside them) exclude each other.
// Inside the critical section each participant creates a marker file with
// O_EXCL and removes it before unlocking; a second participant inside at
// the same time fails to create it.
func TestLockExcludesProcesses(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := newPool(t, url, 4)
	l := newLocker(t, pool)
	ctx := testContext(t)
	marker := filepath.Join(t.TempDir(), "inside")
	const procs, goroutines, rounds = 3, 2, 30

	var wg sync.WaitGroup
	outs := make([]bytes.Buffer, procs)
	errs := make([]error, procs)
	for i := range procs {
		cmd := helperCommand(ctx, url, helperMarker+"="+marker, helperRounds+"="+strconv.Itoa(rounds))
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatalf("start helper: %v", err)
		}
		wg.Go(func() { errs[i] = cmd.Wait() })
	}
	for range goroutines {
		wg.Go(func() {
			if err := criticalSections(ctx, l, marker, rounds); err != nil {
				t.Errorf("in-process participant: %v", err)
			}
		})
	}
	wg.Wait()
	for i := range procs {
		if errs[i] != nil {
			t.Errorf("helper %d: %v\n%s", i, errs[i], outs[i].String())
		} else if !bytes.Contains(outs[i].Bytes(), []byte(fmt.Sprintf("helper: %d critical sections", rounds))) {
			t.Errorf("helper %d did not report its rounds:\n%s", i, outs[i].String())
		}
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Errorf("advisory locks after all participants = %d, want 0", n)
	}
	assertIdle(t, pool)
}

// helperCommand runs this test binary as a helper process
// (TestHelperProcess) on the database url, with env added to its
// environment.
func helperCommand(ctx context.Context, url string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), helperEnv+"=1", helperURL+"="+url), env...)
	return cmd
}

// TestHelperProcess is not a test: TestLockExcludesProcesses runs the test
// binary again with PGLOCK_TEST_HELPER set to make this a participant, and
// TestLockAllAfterHolderProcessKilled to make this a holder it kills.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, os.Getenv(helperURL))
	if err != nil {
		t.Fatalf("helper: pool: %v", err)
	}
	defer pool.Close()
	if set := os.Getenv(helperHoldAll); set != "" {
		holdAll(ctx, t, newLocker(t, pool), strings.Split(set, "\n"))
		return
	}
	rounds, err := strconv.Atoi(os.Getenv(helperRounds))
	if err != nil {
		t.Fatalf("helper: rounds: %v", err)
	}
	if err := criticalSections(ctx, newLocker(t, pool), os.Getenv(helperMarker), rounds); err != nil {
		t.Fatalf("helper: %v", err)
	}
	fmt.Printf("helper: %d critical sections\n", rounds)
}

var errTwoInside = errors.New("another participant is inside the critical section")

func criticalSections(ctx context.Context, l *Locker, marker string, rounds int) error {
	for range rounds {
		lk, err := l.Lock(ctx, "across-processes")
		if err != nil {
			return err
		}
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			_ = lk.Unlock(ctx)
			if errors.Is(err, os.ErrExist) {
				return errTwoInside
			}
			return err
		}
		_ = f.Close()
		time.Sleep(500 * time.Microsecond) // the critical section's work
		if err := os.Remove(marker); err != nil {
			return err
		}
		if err := lk.Unlock(ctx); err != nil {
			return err
		}
	}
	return nil
}
