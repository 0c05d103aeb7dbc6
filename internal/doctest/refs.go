package doctest

import (
	"fmt"
	"go/types"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Ref is a `pkg.Name` or `pkg.Type.Member` in backticks in prose.
type Ref struct {
	Pos  string
	Pkg  string // package name
	Name []string
}

var (
	codeSpan = regexp.MustCompile("`([^`]+)`")
	refForm  = regexp.MustCompile(`^([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Za-z][A-Za-z0-9_]*))?(?:\(.*\))?$`)
)

// Refs returns the references to identifiers of the given packages (by
// name) in the prose of d.
func Refs(d *Doc, pkgs map[string]string) []Ref {
	var refs []Ref
	for _, l := range d.Prose {
		for _, m := range codeSpan.FindAllStringSubmatch(l.Text, -1) {
			for _, part := range strings.Split(m[1], " / ") {
				r := refForm.FindStringSubmatch(strings.TrimSpace(part))
				if r == nil {
					continue
				}
				if _, ok := pkgs[r[1]]; !ok {
					continue
				}
				ref := Ref{Pos: fmt.Sprintf("%s:%d", d.Path, l.N), Pkg: r[1], Name: []string{r[2]}}
				if r[3] != "" {
					ref.Name = append(ref.Name, r[3])
				}
				refs = append(refs, ref)
			}
		}
	}
	return refs
}

// CheckRefs type-checks nothing but resolves each reference in the
// packages' export data: the identifier must exist and be exported, and a
// second part must be a field or method of the first.
func (c *Checker) CheckRefs(refs []Ref, pkgs map[string]string) []error {
	imp := c.importer()
	var errs []error
	for _, r := range refs {
		p, err := imp.Import(pkgs[r.Pkg])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %s: %w", r.Pos, r.Pkg, err))
			continue
		}
		obj := p.Scope().Lookup(r.Name[0])
		if obj == nil || !obj.Exported() {
			errs = append(errs, fmt.Errorf("%s: %s.%s does not exist", r.Pos, r.Pkg, r.Name[0]))
			continue
		}
		if len(r.Name) == 1 {
			continue
		}
		if _, ok := obj.(*types.TypeName); !ok {
			errs = append(errs, fmt.Errorf("%s: %s.%s is not a type, so it has no %s", r.Pos, r.Pkg, r.Name[0], r.Name[1]))
			continue
		}
		m, _, _ := types.LookupFieldOrMethod(types.NewPointer(obj.Type()), true, p, r.Name[1])
		if m == nil {
			errs = append(errs, fmt.Errorf("%s: %s.%s has no field or method %s", r.Pos, r.Pkg, r.Name[0], r.Name[1]))
		}
	}
	return errs
}

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
)

// CheckLinks checks the relative links in the prose of docs: the file
// must exist under root, and an #anchor must be a heading of the Markdown
// file it points into. Links to the web are not followed. pending names
// files that other work will add; links to them are not errors.
func CheckLinks(root string, docs []*Doc, pending map[string]bool) []error {
	anchors := map[string]map[string]bool{}
	for _, d := range docs {
		anchors[d.Path] = Anchors(d)
	}
	var errs []error
	for _, d := range docs {
		for _, l := range d.Prose {
			for _, m := range mdLink.FindAllStringSubmatch(l.Text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, anchor, _ := strings.Cut(target, "#")
				if file == "" {
					file = d.Path
				} else {
					file = path.Clean(path.Join(path.Dir(d.Path), file))
				}
				pos := fmt.Sprintf("%s:%d", d.Path, l.N)
				if pending[file] {
					continue
				}
				_, checked := anchors[file] // one of the documents checked, maybe not on disk
				if !checked && !exists(filepath.Join(root, filepath.FromSlash(file))) {
					errs = append(errs, fmt.Errorf("%s: link to %s: no such file", pos, file))
					continue
				}
				if anchor == "" || !strings.HasSuffix(file, ".md") {
					continue
				}
				a, ok := anchors[file]
				if !ok {
					b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", pos, err))
						continue
					}
					od, err := Parse(file, string(b))
					if err != nil {
						errs = append(errs, fmt.Errorf("%s: %w", pos, err))
						continue
					}
					a = Anchors(od)
					anchors[file] = a
				}
				if !a[anchor] {
					errs = append(errs, fmt.Errorf("%s: link to %s#%s: no such heading", pos, file, anchor))
				}
			}
		}
	}
	return errs
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Anchors returns the anchors of d's headings as GitHub computes them:
// lower case, punctuation dropped, spaces as hyphens, repeats numbered.
func Anchors(d *Doc) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range d.Prose {
		m := heading.FindStringSubmatch(l.Text)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && (unicode.IsLetter(r) || unicode.IsDigit(r)):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

var sectionRef = regexp.MustCompile(`section "([^"]+)" of \[[^\]]*\]\(([^)#]+\.go)\)`)

// CheckSections checks every `the section "X" of [pkg/doc.go](…)` in the
// prose of docs: the Go file must have a doc-comment heading `# X`. The
// docs point into package documentation by section; a renamed section must
// not leave them pointing at nothing.
func CheckSections(root string, docs []*Doc) []error {
	var errs []error
	for _, d := range docs {
		for _, p := range paragraphs(d) {
			for _, m := range sectionRef.FindAllStringSubmatch(p.Text, -1) {
				file := path.Clean(path.Join(path.Dir(d.Path), m[2]))
				pos := fmt.Sprintf("%s:%d", d.Path, p.N)
				b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(file)))
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", pos, err))
					continue
				}
				if !strings.Contains(string(b), "\n// # "+m[1]+"\n") {
					errs = append(errs, fmt.Errorf("%s: %s has no section %q", pos, file, m[1]))
				}
			}
		}
	}
	return errs
}

// paragraphs joins the prose of d into paragraphs (runs of non-blank
// lines), each with the number of its first line.
func paragraphs(d *Doc) []Line {
	var out []Line
	var cur []string
	first, prev := 0, -1
	flush := func() {
		if len(cur) > 0 {
			out = append(out, Line{N: first, Text: strings.Join(cur, " ")})
		}
		cur = nil
	}
	for _, l := range d.Prose {
		t := strings.TrimSpace(l.Text)
		if t == "" || l.N != prev+1 {
			flush()
		}
		prev = l.N
		if t == "" {
			continue
		}
		if len(cur) == 0 {
			first = l.N
		}
		cur = append(cur, t)
	}
	flush()
	return out
}
