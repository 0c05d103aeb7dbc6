package integration_test

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
