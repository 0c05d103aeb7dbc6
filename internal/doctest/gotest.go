package doctest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// GoTest is one `go test` command found in the documentation.
type GoTest struct {
	Pos      string
	Packages []string // as written: ./leases/, ./...
	Run      string   // -run pattern, "" if none
	Bench    string   // -bench pattern, "" if none
}

// GoTests finds the go test commands of a Doc: in shell blocks, and in
// code spans of the prose that start with "go test".
func GoTests(d *Doc) []GoTest {
	var out []GoTest
	for _, b := range d.Blocks {
		if !ShellLangs[b.Lang] || b.NotChecked != "" {
			continue
		}
		for _, line := range commandLines(b) {
			for _, words := range shellCommands(line.Text) {
				if gt, ok := parseGoTest(words); ok {
					gt.Pos = b.Pos(line.N)
					out = append(out, gt)
				}
			}
		}
	}
	for _, l := range d.Prose {
		for _, m := range codeSpan.FindAllStringSubmatch(l.Text, -1) {
			if !strings.HasPrefix(m[1], "go test ") {
				continue
			}
			for _, words := range shellCommands(m[1]) {
				if gt, ok := parseGoTest(words); ok {
					gt.Pos = fmt.Sprintf("%s:%d", d.Path, l.N)
					out = append(out, gt)
				}
			}
		}
	}
	return out
}

func parseGoTest(words []string) (GoTest, bool) {
	for len(words) > 0 && isAssignment(words[0]) {
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "test" {
		return GoTest{}, false
	}
	var gt GoTest
	for i := 2; i < len(words); i++ {
		w := words[i]
		name, value, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		switch {
		case strings.HasPrefix(w, "-") && (name == "run" || name == "bench"):
			if !hasValue && i+1 < len(words) {
				i++
				value = words[i]
			}
			if name == "run" {
				gt.Run = value
			} else {
				gt.Bench = value
			}
		case strings.HasPrefix(w, "-"):
			// -race, -count=1, -v, -timeout 12m: a value that follows is not a package
		case strings.HasPrefix(w, "./") || w == ".":
			gt.Packages = append(gt.Packages, w)
		}
	}
	return gt, true
}

var testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Example|Fuzz)\w*)\(`)

// CheckGoTest reports a -run or -bench pattern that matches no function of
// the packages named (the pattern '^$', which runs nothing on purpose, is
// fine). Only the first element of a pattern is checked: what follows a /
// names subtests.
func CheckGoTest(root string, gt GoTest) []error {
	var errs []error
	for _, kind := range []struct{ prefix, pattern string }{{"Test", gt.Run}, {"Benchmark", gt.Bench}} {
		if kind.pattern == "" || kind.pattern == "^$" {
			continue
		}
		first, _, _ := strings.Cut(kind.pattern, "/")
		re, err := regexp.Compile(first)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: pattern %q: %w", gt.Pos, kind.pattern, err))
			continue
		}
		pkgs := gt.Packages
		if len(pkgs) == 0 {
			pkgs = []string{"."}
		}
		for _, p := range pkgs {
			names, err := testFuncs(root, p)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", gt.Pos, err))
				continue
			}
			found := false
			for _, n := range names {
				if strings.HasPrefix(n, kind.prefix) && re.MatchString(n) {
					found = true
					break
				}
			}
			if !found {
				errs = append(errs, fmt.Errorf("%s: %q matches no %s function in %s", gt.Pos, kind.pattern, kind.prefix, p))
			}
		}
	}
	return errs
}

// testFuncs lists the test, benchmark, example and fuzz functions of the
// package directory p (relative to root; "./..." means all of them).
func testFuncs(root, p string) ([]string, error) {
	dir := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(strings.TrimSuffix(p, "..."), "/")))
	recursive := strings.HasSuffix(p, "...")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("no package directory %s", p)
	}
	var names []string
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if path != dir && (!recursive || e.Name() == "testdata" || strings.HasPrefix(e.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
			names = append(names, m[1])
		}
		return nil
	})
	return names, err
}
