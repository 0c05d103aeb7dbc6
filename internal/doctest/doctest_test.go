package doctest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pgfence/pgfence/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// pending are files other work adds to docs/; links to them are allowed
// before they exist. TestLinks fails once such a file is in the tree, so
// that its links are checked from then on.
var pending = map[string]bool{}

// root is the repository root: two directories up from this package.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", r, err)
	}
	return r
}

var (
	setupOnce sync.Once
	setupMod  *Module
	setupDocs []*Doc
	setupErr  error
)

// setup loads the module and the documentation once for all tests.
func setup(t *testing.T) (*Module, []*Doc) {
	t.Helper()
	setupOnce.Do(func() {
		r := root(t)
		setupMod, setupErr = LoadModule(r)
		if setupErr != nil {
			return
		}
		setupDocs, setupErr = LoadAll(r)
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	return setupMod, setupDocs
}

// checkGo prepares and type-checks the Go blocks of docs and returns every
// error, and how many blocks it checked.
func checkGo(t *testing.T, m *Module, docs []*Doc) (errs []error, checked int) {
	t.Helper()
	var snippets []*Snippet
	for _, d := range docs {
		for _, b := range d.Blocks {
			if b.Lang != "go" || b.NotChecked != "" {
				continue
			}
			s, err := m.Prepare(b)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			snippets = append(snippets, s)
		}
	}
	c, err := m.NewChecker(snippets)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snippets {
		if e := c.Check(s); len(e) > 0 {
			errs = append(errs, e...)
			t.Logf("%s: generated %s file:\n%s", s.Block.Pos(0), s.Kind, s.Src)
		}
	}
	return errs, len(snippets)
}

// TestGoBlocks type-checks every ```go block of README.md and docs/*.md.
func TestGoBlocks(t *testing.T) {
	t.Parallel()
	m, docs := setup(t)
	errs, checked := checkGo(t, m, docs)
	report(t, "Go blocks", errs, checked)
}

// report fails t with every error, and when nothing was checked at all:
// a check that finds nothing to check must not pass silently.
func report(t *testing.T, what string, errs []error, checked int) {
	t.Helper()
	for _, err := range errs {
		t.Error(err)
	}
	if checked == 0 {
		t.Fatalf("no %s found in the documentation: is it where this test looks?", what)
	}
	t.Logf("%d %s checked", checked, what)
}

// TestGoBlocksCatchDrift proves that TestGoBlocks can fail: a block calling
// a function pgfence does not have, or calling one with the wrong
// arguments, is reported at its line in the Markdown file.
func TestGoBlocksCatchDrift(t *testing.T) {
	t.Parallel()
	m, _ := setup(t)
	d, err := Parse("drift.md", "# drift\n\n```go\nlocker, _ := pglock.New(pool)\n_ = locker.NoSuchMethod(ctx)\n```\n\n```go\nfunc f() error {\n\treturn fencing.InTx(ctx, pool, 42, nil)\n}\n```\n\n<!-- not-checked: deliberately broken -->\n```go\nthis is not Go\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	errs, checked := checkGo(t, m, []*Doc{d})
	if checked != 2 {
		t.Errorf("checked %d blocks, want 2 (the third opts out)", checked)
	}
	want := []string{"drift.md:5:", "NoSuchMethod", "drift.md:10:"}
	all := errors.Join(errs...)
	for _, w := range want {
		if all == nil || !strings.Contains(all.Error(), w) {
			t.Errorf("errors %v do not mention %q", all, w)
		}
	}
}

var (
	cliOnce sync.Once
	cliRoot *Command
	cliErr  error
)

// loadCLI builds the pgfence command once and reads its command tree.
func loadCLI(t *testing.T) *Command {
	t.Helper()
	cliOnce.Do(func() {
		dir, err := os.MkdirTemp("", "doctest-cli-")
		if err != nil {
			cliErr = err
			return
		}
		defer os.RemoveAll(dir)
		bin, err := BuildCLI(root(t), dir)
		if err != nil {
			cliErr = err
			return
		}
		cliRoot, cliErr = LoadCLI(bin)
	})
	if cliErr != nil {
		t.Fatal(cliErr)
	}
	return cliRoot
}

func checkCommands(cli *Command, docs []*Doc) (errs []error, checked int) {
	for _, d := range docs {
		for _, b := range d.Blocks {
			if !ShellLangs[b.Lang] || b.NotChecked != "" {
				continue
			}
			for _, inv := range Invocations(b) {
				errs = append(errs, cli.CheckInvocation(inv)...)
				checked++
			}
		}
	}
	return errs, checked
}

// TestPgfenceCommands checks that every pgfence command in a shell block
// names subcommands and flags the CLI has.
func TestPgfenceCommands(t *testing.T) {
	t.Parallel()
	_, docs := setup(t)
	cli := loadCLI(t)
	errs, checked := checkCommands(cli, docs)
	report(t, "pgfence commands", errs, checked)
}

// TestPgfenceCommandsCatchDrift proves that TestPgfenceCommands can fail.
func TestPgfenceCommandsCatchDrift(t *testing.T) {
	t.Parallel()
	cli := loadCLI(t)
	d, err := Parse("drift.md", "```sh\n"+
		"pgfence leases ls --json                        # fine\n"+
		"pgfence --database-url \"$URL\" migrate up        # fine: a global flag's value is not a command\n"+
		"pgfence leases list                             # no such subcommand\n"+
		"DATABASE_URL=x pgfence run --lease a --tll 5s -- true   # misspelt flag\n"+
		"pgfence run --lock a -- psql --not-ours         # after --: the command's own\n"+
		"```\n\n```console\n$ go run ./cmd/pgfence check --max-age 1h\nNAME --bogus (output, not a command)\n```\n\n"+
		"```cron\n*/5 * * * *  pgfence lease ls\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	errs, checked := checkCommands(cli, []*Doc{d})
	if checked != 7 {
		t.Errorf("found %d commands, want 7", checked)
	}
	all := errors.Join(errs...)
	for _, w := range []string{
		`drift.md:4: pgfence leases has no subcommand "list"`,
		"drift.md:5: pgfence run has no flag --tll",
		"drift.md:10: pgfence check has no flag --max-age",
		`drift.md:15: pgfence has no subcommand "lease"`,
	} {
		if all == nil || !strings.Contains(all.Error(), w) {
			t.Errorf("errors %v do not contain %q", all, w)
		}
	}
	if len(errs) != 4 {
		t.Errorf("got %d errors, want 4: %v", len(errs), all)
	}
}

// TestGoTestCommands checks that the -run and -bench patterns of every
// go test command in the documentation match a function of the packages
// named: the performance tables name the benchmark behind each figure.
func TestGoTestCommands(t *testing.T) {
	t.Parallel()
	_, docs := setup(t)
	r := root(t)
	var errs []error
	n := 0
	for _, d := range docs {
		for _, gt := range GoTests(d) {
			n++
			errs = append(errs, CheckGoTest(r, gt)...)
		}
	}
	report(t, "go test commands", errs, n)

	// And the check can fail.
	d, err := Parse("drift.md", "```sh\ngo test -run '^$' -bench TryAcquireRelese ./leases/\ngo test -race ./integration_test/ -run TestPause -v\n```\n\n| a | `go test -run TestNoSuch/sub ./pglock/` |\n")
	if err != nil {
		t.Fatal(err)
	}
	errs = nil
	gts := GoTests(d)
	for _, gt := range gts {
		errs = append(errs, CheckGoTest(r, gt)...)
	}
	if len(gts) != 3 || len(errs) != 2 {
		t.Errorf("drift: %d commands, errors %v; want 3 commands, 2 errors (TryAcquireRelese, TestNoSuch)", len(gts), errs)
	}
}

// TestIdentifierReferences checks that every `pkg.Name` in the prose names
// an identifier of pgfence's public packages that exists.
func TestIdentifierReferences(t *testing.T) {
	t.Parallel()
	m, docs := setup(t)
	c, err := m.NewChecker(nil)
	if err != nil {
		t.Fatal(err)
	}
	var refs []Ref
	for _, d := range docs {
		refs = append(refs, Refs(d, m.Packages)...)
	}
	report(t, "identifier references", c.CheckRefs(refs, m.Packages), len(refs))

	// And the check can fail.
	d, err := Parse("drift.md", "See `leases.Client.Runn`, `pglock.NoSuch` and `fencing.Token.Fence`.\n")
	if err != nil {
		t.Fatal(err)
	}
	errs := c.CheckRefs(Refs(d, m.Packages), m.Packages)
	if len(errs) != 2 {
		t.Errorf("drifted references: got %v, want 2 errors (Runn, NoSuch)", errs)
	}
}

// TestSections checks that every "the section "X" of [pkg/doc.go]" names
// a heading of that file's doc comment.
func TestSections(t *testing.T) {
	t.Parallel()
	_, docs := setup(t)
	r := root(t)
	for _, err := range CheckSections(r, docs) {
		t.Error(err)
	}
	d, err := Parse("docs/drift.md", "See the section\n\"Deadline rule\" of [leases/doc.go](../leases/doc.go), and the section \"The deadline rule\" of [leases/doc.go](../leases/doc.go).\n")
	if err != nil {
		t.Fatal(err)
	}
	if errs := CheckSections(r, []*Doc{d}); len(errs) != 1 || !strings.Contains(errs[0].Error(), `no section "Deadline rule"`) {
		t.Errorf("drifted section: got %v, want one error for \"Deadline rule\"", errs)
	}
}

// TestLinks checks the relative links between the documents.
func TestLinks(t *testing.T) {
	t.Parallel()
	_, docs := setup(t)
	r := root(t)
	for file := range pending {
		if _, err := os.Stat(filepath.Join(r, filepath.FromSlash(file))); err == nil {
			t.Errorf("%s exists: remove it from pending, so that links to it are checked", file)
		}
	}
	for _, err := range CheckLinks(r, docs, pending) {
		t.Error(err)
	}
	d, err := Parse("docs/drift.md", "# Drift\n\n[a](../README.md#no-such-heading), [b](missing.md), [c](#drift), [d](https://example.org/x)\n")
	if err != nil {
		t.Fatal(err)
	}
	errs := CheckLinks(r, append([]*Doc{d}, docs...), nil)
	var mine []error
	for _, e := range errs {
		if strings.HasPrefix(e.Error(), "docs/drift.md") {
			mine = append(mine, e)
		}
	}
	if len(mine) != 2 {
		t.Errorf("drifted links: got %v, want 2 errors (the anchor, the file)", mine)
	}
}
