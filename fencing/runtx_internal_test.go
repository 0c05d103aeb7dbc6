package fencing

import (
	"context"
	"errors"
	"testing"
)

// A driver that panics inside COMMIT leaves the transaction in doubt:
// runTx rolls it back as it does when fn panics, and the panic goes on.
// A COMMIT that returns an error is not rolled back again. (The driver's
// behaviour is faked: what is tested is runTx's own bookkeeping.)
func TestRunTxRollsBackWhenCommitPanics(t *testing.T) {
	tok := Token{Lease: "job", Fence: 7}
	fn := func(int) error { return nil }
	begin := func(context.Context) (int, error) { return 1, nil }
	for _, tc := range []struct {
		name      string
		commit    func(context.Context, int) error
		wantAbort bool
	}{
		{"panics", func(context.Context, int) error { panic("driver bug") }, true},
		{"fails", func(context.Context, int) error { return errors.New("connection reset") }, false},
		{"commits", func(context.Context, int) error { return nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aborted := false
			abort := func(context.Context, int) { aborted = true }
			func() {
				defer func() { _ = recover() }()
				_ = runTx(context.Background(), tok, fn, nil, begin, tc.commit, abort)
			}()
			if aborted != tc.wantAbort {
				t.Errorf("rolled back: %v, want %v", aborted, tc.wantAbort)
			}
		})
	}
}
