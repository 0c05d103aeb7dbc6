package doctest

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/pgfence/pgfence/internal/gocmd"
)

// envDecl is a name a snippet may use without declaring it (see the package
// documentation), with its declaration and the imports that needs.
type envDecl struct {
	decl    string
	imports []string
}

var env = map[string]envDecl{
	"ctx":         {"var ctx context.Context", []string{"context"}},
	"pool":        {"var pool *pgxpool.Pool", []string{"github.com/jackc/pgx/v5/pgxpool"}},
	"tx":          {"var tx pgx.Tx", []string{"github.com/jackc/pgx/v5"}},
	"databaseURL": {"var databaseURL string", nil},
	"logger":      {"var logger *slog.Logger", []string{"log/slog"}},
	"work":        {"var work func(context.Context) error", []string{"context"}},
	"locker":      {"var locker *pglock.Locker", []string{"github.com/pgfence/pgfence/pglock"}},
	"client":      {"var client *leases.Client", []string{"github.com/pgfence/pgfence/leases"}},
}

// stdPackages are the packages a snippet may use without importing them,
// by name. Packages is extended with pgfence's own public packages.
var stdPackages = map[string]string{
	"context":   "context",
	"errors":    "errors",
	"fmt":       "fmt",
	"log":       "log",
	"os":        "os",
	"signal":    "os/signal",
	"syscall":   "syscall",
	"slog":      "log/slog",
	"http":      "net/http",
	"strings":   "strings",
	"sync":      "sync",
	"time":      "time",
	"testing":   "testing",
	"sql":       "database/sql",
	"pgx":       "github.com/jackc/pgx/v5",
	"pgxpool":   "github.com/jackc/pgx/v5/pgxpool",
	"pgconn":    "github.com/jackc/pgx/v5/pgconn",
	"otel":      "go.opentelemetry.io/otel",
	"metric":    "go.opentelemetry.io/otel/metric",
	"migrate":   "github.com/golang-migrate/migrate/v4",
	"pgerrcode": "github.com/jackc/pgerrcode",
}

// Snippet is a Go block turned into a file of its own package, ready to
// type-check.
type Snippet struct {
	Block Block
	Src   string // the generated file
	Kind  string // "file", "decls" or "body"
}

// Module describes this repository for the checks: where it is and which
// public packages it has.
type Module struct {
	Root     string
	Path     string            // module path
	Packages map[string]string // package name -> import path, public packages only
}

// LoadModule finds the module rooted at root and its public packages
// (everything but internal/, cmd/ and test-only packages).
func LoadModule(root string) (*Module, error) {
	out, err := goCmd(root, "list", "-m", "-f", "{{.Path}}")
	if err != nil {
		return nil, err
	}
	m := &Module{Root: root, Path: strings.TrimSpace(out), Packages: map[string]string{}}
	out, err = goCmd(root, "list", "-f", "{{.ImportPath}} {{.Name}}", "./...")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		p, name, ok := strings.Cut(line, " ")
		if !ok || name == "main" || strings.Contains(p, "/internal/") || strings.Contains(p, "/cmd/") ||
			strings.HasSuffix(p, "_test") || p == m.Path {
			continue
		}
		m.Packages[name] = p
	}
	return m, nil
}

// known maps a package name a snippet uses to its import path.
func (m *Module) known(name string) (string, bool) {
	if p, ok := m.Packages[name]; ok {
		return p, true
	}
	p, ok := stdPackages[name]
	return p, ok
}

// Prepare turns a Go block into a Snippet: as written when it is a whole
// file, else wrapped (declarations in a file, statements in a function
// body), with missing imports and environment names added. Positions in
// the generated file map back to the Markdown file through //line
// directives.
func (m *Module) Prepare(b Block) (*Snippet, error) {
	lineDir := fmt.Sprintf("//line %s:%d\n", b.Doc, b.Line)
	fset := token.NewFileSet()
	if f, err := parser.ParseFile(fset, "", b.Text, parser.PackageClauseOnly); err == nil && f.Name != nil {
		return &Snippet{Block: b, Src: lineDir + b.Text, Kind: "file"}, nil
	}
	kinds := []struct {
		kind, head, tail string
	}{
		{"decls", "", ""},
		{"body", "func _() error {\n", "\nreturn nil\n}\n"},
	}
	var firstErr error
	for _, k := range kinds {
		src := "package snippet\n" + k.head + lineDir + b.Text + k.tail
		f, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		imports, decls := m.missing(f)
		var head strings.Builder
		head.WriteString("package snippet\n")
		for _, p := range imports {
			fmt.Fprintf(&head, "import %q\n", p)
		}
		var tail strings.Builder
		if len(decls) > 0 {
			tail.WriteString("\n//line doctest-environment:1\n")
			for _, d := range decls {
				tail.WriteString(d + "\n")
			}
		}
		return &Snippet{Block: b, Src: head.String() + k.head + lineDir + b.Text + k.tail + tail.String(), Kind: k.kind}, nil
	}
	return nil, fmt.Errorf("%s: not Go: neither a file, declarations nor statements: %w", b.Pos(0), firstErr)
}

// missing returns the imports and environment declarations that f needs:
// for every identifier the parser could not resolve in f that names a
// known package f does not import, or an environment name.
func (m *Module) missing(f *ast.File) (imports, decls []string) {
	imported := map[string]bool{}
	for _, is := range f.Imports {
		p := strings.Trim(is.Path.Value, `"`)
		if is.Name != nil {
			imported[is.Name.Name] = true
		} else {
			imported[packageName(p)] = true
		}
	}
	need := map[string]bool{}
	seenDecl := map[string]bool{}
	for _, id := range f.Unresolved {
		name := id.Name
		if e, ok := env[name]; ok && !seenDecl[name] {
			seenDecl[name] = true
			decls = append(decls, e.decl)
			for _, p := range e.imports {
				if !imported[packageName(p)] {
					need[p] = true
				}
			}
			continue
		}
		if imported[name] {
			continue
		}
		if p, ok := m.known(name); ok {
			need[p] = true
		}
	}
	for p := range need {
		imports = append(imports, p)
	}
	sort.Strings(imports)
	sort.Strings(decls)
	return imports, decls
}

var majorVersion = regexp.MustCompile(`^v[0-9]+$`)

// packageName guesses the name of the package at import path p: its last
// element, or the one before a /vN suffix.
func packageName(p string) string {
	base := path.Base(p)
	if majorVersion.MatchString(base) {
		base = path.Base(path.Dir(p))
	}
	return base
}

// Checker type-checks Snippets against export data built by the go command.
type Checker struct {
	fset    *token.FileSet
	imp     types.Importer
	exports map[string]string // import path -> export data file
	missing map[string]string // import path -> why go list has no export data
}

// NewChecker builds (or finds in the build cache) export data for every
// package the snippets import, the module's public packages, and their
// dependencies, with one go list.
func (m *Module) NewChecker(snippets []*Snippet) (*Checker, error) {
	paths := map[string]bool{}
	for _, p := range m.Packages {
		paths[p] = true
	}
	for _, s := range snippets {
		f, err := parser.ParseFile(token.NewFileSet(), "", s.Src, parser.ImportsOnly)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Block.Pos(0), err)
		}
		for _, is := range f.Imports {
			paths[strings.Trim(is.Path.Value, `"`)] = true
		}
	}
	args := []string{"list", "-e", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}\t{{with .Error}}{{.Err}}{{end}}"}
	for p := range paths {
		if p != "C" && p != "unsafe" {
			args = append(args, p)
		}
	}
	c := &Checker{fset: token.NewFileSet(), exports: map[string]string{}, missing: map[string]string{}}
	if len(args) == 6 {
		return c, nil
	}
	out, err := goCmd(m.Root, args...)
	if err != nil {
		return nil, err
	}
	// Not TrimSpace: the last line ends in the tab before an empty error.
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 3 {
			continue
		}
		switch {
		case f[1] != "":
			c.exports[f[0]] = f[1]
		case f[2] != "":
			c.missing[f[0]] = strings.ReplaceAll(f[2], "\n", " ")
		}
	}
	return c, nil
}

// Check type-checks one Snippet and returns its errors, positioned in the
// Markdown file. Unused variables and imports are not errors: a snippet is
// an excerpt.
func (c *Checker) Check(s *Snippet) []error {
	f, err := parser.ParseFile(c.fset, s.Block.Doc, s.Src, parser.ParseComments)
	if err != nil {
		return []error{err}
	}
	var errs []error
	conf := types.Config{
		Importer: c.importer(),
		Error: func(err error) {
			var te types.Error
			if errors.As(err, &te) && te.Soft {
				return
			}
			errs = append(errs, err)
		},
	}
	_, _ = conf.Check("snippet", c.fset, []*ast.File{f}, nil)
	return errs
}

// importer returns the one importer of c, so that every package is read
// from its export data once.
func (c *Checker) importer() types.Importer {
	if c.imp == nil {
		c.imp = importer.ForCompiler(c.fset, "gc", c.lookup)
	}
	return c.imp
}

func (c *Checker) lookup(p string) (io.ReadCloser, error) {
	if e, ok := c.exports[p]; ok {
		return os.Open(e)
	}
	if why, ok := c.missing[p]; ok {
		return nil, fmt.Errorf("not available in this module: %s", why)
	}
	return nil, fmt.Errorf("%s: not in this module's build graph", p)
}

// goCmd runs the go command in dir and returns its stdout. It builds as
// the test binary was built (with -race under CI), so that the export
// data and the command come from the build cache.
func goCmd(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS="+gocmd.GOFLAGS(os.Getenv("GOFLAGS")))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}
