package fencing

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/dbx"
)

// maxIdentifier is PostgreSQL's longest identifier in bytes (NAMEDATALEN-1).
// Longer names are silently truncated by the server, which could make a
// name address a different table, so they are refused instead.
const maxIdentifier = 63

// Protect installs the fence guard on table, which must be an ordinary or
// partitioned table with a column named fence of type bigint
// (e.g. `fence bigint NOT NULL DEFAULT 0`). From then on every INSERT,
// UPDATE, DELETE (row trigger pgfence_guard) and TRUNCATE (statement
// trigger pgfence_guard_truncate) of the table must declare a token that is
// not stale; see the package documentation for the rules.
//
// table is "table" or "schema.table", taken literally, not as SQL: each part
// is the exact, case-sensitive name ("Mixed Case" names the table created as
// "Mixed Case", orders does not name one created as Orders without quotes
// — that one is orders). An unqualified name is resolved with the
// connection's search_path. Quotes and other characters need no escaping;
// the name is quoted with pgx.Identifier and sent as a parameter, never
// spliced into SQL. For a name that itself contains a dot, use
// ProtectIdentifier.
//
// Errors: ErrInvalid for a malformed name or a nil db or context (nothing
// is sent); otherwise
// the database's error, wrapped: SQLSTATE 42P01 (no such table; from
// PostgreSQL 17 on also for a table whose schema does not exist), 3F000 (no
// such schema — the table's, before 17, or pgfence's when `pgfence migrate
// up` has not run), 42703 (no fence column), 42804 (fence is not bigint), 42P16 (fence
// is a generated column, which PostgreSQL would compute over the guard's
// stamp; migration 15), 42809 (not a table), 42501 (not the table's owner,
// or not a pgfence_client). On error nothing changed.
//
// Protect covers the table and every table below it: partitions and
// inheritance children. The row trigger reaches future partitions by
// itself, but a future partition's own TRUNCATE trigger and a future
// inheritance child's triggers do not exist until Protect runs again: run
// it after attaching a partition or adding a child (`pgfence check` lists
// tables left unguarded). A partition detached from a protected table
// loses the row trigger it had from its parent and keeps its own TRUNCATE
// trigger: half guarded, which `pgfence check` lists (migration 18).
// Protect it again if it is to stay protected (or drop its trigger
// pgfence_guard_truncate).
//
// Protect is safe to repeat: it replaces the triggers. It needs a role that
// owns the table and is a pgfence_client (migration 13; before it, the
// role that ran the migrations); ctx bounds the single statement it runs.
func Protect(ctx context.Context, db DB, table string) error {
	id, err := splitTable(table)
	if err != nil {
		return err
	}
	return ProtectIdentifier(ctx, db, id)
}

// ProtectIdentifier is Protect for a table named by its parts:
// pgx.Identifier{"table"} or pgx.Identifier{"schema", "table"}, each part
// exact and case-sensitive. Use it for names that contain a dot.
func ProtectIdentifier(ctx context.Context, db DB, table pgx.Identifier) error {
	if dbx.IsNil(db) {
		return fmt.Errorf("%w: db must not be nil", ErrInvalid)
	}
	if ctx == nil {
		return fmt.Errorf("%w: context must not be nil", ErrInvalid)
	}
	if err := checkIdentifier(table); err != nil {
		return err
	}
	name := table.Sanitize()
	if _, err := db.Exec(ctx, sqlProtect, name); err != nil {
		switch sqlState(err) {
		case "3F000", "42883": // invalid_schema_name, undefined_function
			return fmt.Errorf("fencing: protect %s: %w (the table's schema, or pgfence's: has `pgfence migrate up` run?)", name, err)
		}
		return fmt.Errorf("fencing: protect %s: %w", name, err)
	}
	return nil
}

// splitTable splits "schema.table" or "table" into an identifier.
func splitTable(table string) (pgx.Identifier, error) {
	if table == "" {
		return nil, fmt.Errorf("%w: table name is empty", ErrInvalid)
	}
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("%w: table name %q has more than one dot: use ProtectIdentifier for names that contain dots", ErrInvalid, table)
	}
	return pgx.Identifier(parts), nil
}

func checkIdentifier(id pgx.Identifier) error {
	if len(id) < 1 || len(id) > 2 {
		return fmt.Errorf("%w: table identifier must have 1 or 2 parts (table or schema, table), got %d", ErrInvalid, len(id))
	}
	for _, p := range id {
		switch {
		case p == "":
			return fmt.Errorf("%w: table name %q has an empty part", ErrInvalid, strings.Join(id, "."))
		case len(p) > maxIdentifier:
			return fmt.Errorf("%w: table name part %q is %d bytes, PostgreSQL names are at most %d", ErrInvalid, p, len(p), maxIdentifier)
		case strings.IndexByte(p, 0) >= 0:
			return fmt.Errorf("%w: table name part %q contains a NUL byte", ErrInvalid, p)
		case !utf8.ValidString(p):
			// Go strings name tables in UTF-8, which the session
			// converts to the server's encoding; the server refuses
			// other bytes (22021), and its error would echo them raw.
			return fmt.Errorf("%w: table name part %q is not valid UTF-8", ErrInvalid, p)
		}
	}
	return nil
}
