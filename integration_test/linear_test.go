package integration_test

import (
	"context"
	"errors"
)

// opRecord is one operation of a linearizability history.
type opRecord struct{}

func roleLinear(ctx context.Context, wk *workerSide) error { return errors.New("not yet") }
