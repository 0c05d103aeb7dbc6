package migrations

import "testing"

// The advisory lock must be golang-migrate's, so that Up and the upstream
// CLI never migrate the same database at once. The expected value is what
// golang-migrate v4.20.1's database.GenerateAdvisoryLockId("pgfence_test",
// "public", "pgfence_schema_migrations") returns.
func TestAdvisoryLockIDMatchesGolangMigrate(t *testing.T) {
	if got := advisoryLockID("pgfence_test", "public", Table); got != 837832432 {
		t.Fatalf("advisoryLockID = %d, want golang-migrate's 837832432", got)
	}
}
