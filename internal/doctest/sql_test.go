package doctest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgtest"
)

// sqlFixture runs before every SQL block, in the block's transaction: the
// role the grant examples name. CREATE ROLE is transactional, so the role
// is gone again after the rollback; on a server that has a role app (the
// tests' URL may name a shared server) the blocks use that one, and what
// they grant it is rolled back too.
const sqlFixture = `DO $$
BEGIN
	CREATE ROLE app NOLOGIN;
EXCEPTION WHEN duplicate_object THEN
	NULL;
END $$`

// runSQLBlocks runs each SQL block of docs in a transaction of its own on
// a migrated database, after sqlFixture, and rolls it back. It returns the
// errors, positioned at their block, and how many blocks ran. A block with
// $1-style parameters is prepared instead of run: PostgreSQL still parses
// and plans it against the schema.
func runSQLBlocks(t *testing.T, docs []*Doc) (errs []error, ran int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, d := range docs {
		for _, b := range d.Blocks {
			if b.Lang != "sql" || b.NotChecked != "" {
				continue
			}
			ran++
			if err := runSQL(ctx, conn, b.Text); err != nil {
				errs = append(errs, blockError{b, err})
			}
		}
	}
	return errs, ran
}

func runSQL(ctx context.Context, conn *pgx.Conn, text string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, sqlFixture); err != nil {
		return err
	}
	if strings.Contains(text, "$1") {
		_, err = tx.Prepare(ctx, "", text)
	} else {
		_, err = tx.Exec(ctx, text, pgx.QueryExecModeSimpleProtocol)
	}
	if err != nil {
		return err
	}
	// Session-level advisory locks outlive the rollback: leave none.
	_, err = tx.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	return err
}

type blockError struct {
	b   Block
	err error
}

func (e blockError) Error() string { return e.b.Pos(0) + ": " + e.err.Error() }

// TestSQLBlocks runs every ```sql block of README.md and docs/*.md against
// a database with pgfence's schema.
func TestSQLBlocks(t *testing.T) {
	t.Parallel()
	_, docs := setup(t)
	errs, ran := runSQLBlocks(t, docs)
	report(t, "SQL blocks", errs, ran)

	// And the check can fail.
	d, err := Parse("drift.md", "```sql\nSELECT held_since FROM pgfence.lease_status;\n```\n\n```sql\nSELECT pgfence.lock_key('a');\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	errs, ran = runSQLBlocks(t, []*Doc{d})
	if ran != 2 || len(errs) != 1 || !strings.Contains(errs[0].Error(), "drift.md:2:") || !strings.Contains(errs[0].Error(), "held_since") {
		t.Errorf("drifted SQL: ran %d, errors %v; want 2 run, one error at drift.md:2 about held_since", ran, errs)
	}
}
