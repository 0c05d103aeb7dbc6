package fencing

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestClassifyKeepsClassifiedErrors: an error classified already (a nested
// InTx's, returned by the outer one's fn, wrapped or not) comes back from
// classify unchanged, not wrapped again under the outer token.
func TestClassifyKeepsClassifiedErrors(t *testing.T) {
	inner := Token{Lease: "inner", Fence: 1}
	outer := Token{Lease: "outer", Fence: 2}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"stale", classify(inner, &pgconn.PgError{Code: SQLStateStale})},
		{"no token", classify(inner, &pgconn.PgError{Code: SQLStateNoToken})},
	} {
		for _, err := range []error{c.err, fmt.Errorf("step: %w", c.err)} {
			if got := classify(outer, err); got != err {
				t.Errorf("%s: classify(%v) = %v, want it unchanged", c.name, err, got)
			}
		}
	}
}
