package pgtest

import (
	"testing"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// PgBouncer is a PgBouncer process owned by one test; see
// pgcluster.PgBouncer for URL, Port and Mode.
type PgBouncer = pgcluster.PgBouncer

// PoolMode is PgBouncer's pool_mode; BouncerOption configures
// StartPgBouncer.
type (
	PoolMode      = pgcluster.PoolMode
	BouncerOption = pgcluster.BouncerOption
)

// Pool modes for StartPgBouncer.
const (
	SessionPooling     = pgcluster.SessionPooling
	TransactionPooling = pgcluster.TransactionPooling
	StatementPooling   = pgcluster.StatementPooling
)

// WithBouncerSetting sets a line of pgbouncer.ini, for example
// WithBouncerSetting("default_pool_size", "2").
func WithBouncerSetting(name, value string) BouncerOption {
	return pgcluster.WithBouncerSetting(name, value)
}

// StartPgBouncer starts PgBouncer in front of the server serverURL points
// at (pgtest.URL(t) gives a database there; its URL(dbname) reaches any
// database of that server), pooling in mode. It belongs to t and is
// stopped when t ends. It fails t — never skips — when pgbouncer is not
// installed, saying how to install it.
func StartPgBouncer(t testing.TB, serverURL string, mode PoolMode, opts ...BouncerOption) *PgBouncer {
	t.Helper()
	b, err := pgcluster.NewPgBouncer(serverURL, mode, opts...)
	if err != nil {
		t.Fatalf("pgtest: start pgbouncer (%s pooling): %v\n"+
			"The PgBouncer tests need pgbouncer 1.18 or newer: apt-get install -y pgbouncer (bash .ci/run installs it).", mode, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("pgtest: stop pgbouncer: %v", err)
		}
	})
	return b
}
