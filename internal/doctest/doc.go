// Package doctest checks the code in pgfence's Markdown documentation
// (README.md and docs/*.md) against the code, so that a snippet that drifts
// from the API or the CLI fails the tests. It exports helpers for its own
// tests only.
//
// # What is checked
//
//   - Every ```go block type-checks (go/types, against the export data of
//     the packages it uses, as built by `go list -export` in this module).
//     A block that starts with `package` is a file of its own; a block of
//     declarations (imports, funcs, types) is a file of package snippet; any
//     other block is the body of a `func() error`. Imports that a block
//     leaves out are added from the package names it uses (pgfence's public
//     packages, pgx, pgxpool, pgconn, otel, common standard packages).
//     Unused variables and imports are allowed: snippets are excerpts.
//   - Every ```sql block runs, in a transaction that is rolled back, on a
//     database with pgfence's migrations applied (internal/pgtest), after
//     `CREATE ROLE app` for the grant examples; a block with $1-style
//     parameters is prepared instead.
//   - Every `pgfence …` (or `go run ./cmd/pgfence …`) command in a ```sh,
//     ```bash, ```shell, ```console ("$ " lines) or ```cron block names
//     subcommands and flags that the CLI has, as its --help output says.
//   - Every `pkg.Name` or `pkg.Type.Method` in backticks in the prose, for
//     pgfence's public packages, names an exported identifier that exists:
//     the docs point at doc comments instead of restating them, and those
//     pointers must not dangle.
//   - Every relative link points at an existing file, and every #anchor at
//     a heading of the file it names; every `the section "X" of
//     [pkg/doc.go](…)` names a `# X` heading of that doc comment.
//   - Every `go test` command's -run and -bench patterns match a function
//     of the packages it names.
//
// # The snippet environment
//
// A block may use these names without declaring them; each is declared for
// the block only when it uses the name and does not declare it itself:
//
//	ctx         context.Context
//	pool        *pgxpool.Pool
//	tx          pgx.Tx
//	databaseURL string
//	logger      *slog.Logger
//	work        func(context.Context) error   // "your code"
//	locker      *pglock.Locker
//	client      *leases.Client
//
// # Opting out
//
// A block that is deliberately not checkable (it needs a module pgfence
// does not depend on, say) is preceded by a comment on the line before its
// fence, with a reason:
//
//	<!-- not-checked: imports the Prometheus exporter, not a pgfence dependency -->
//
// Use it sparingly: an unchecked block is free to drift.
package doctest
