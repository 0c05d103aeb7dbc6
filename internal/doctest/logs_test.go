package doctest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// logCall matches a log call of the library's packages and captures its
// message, a string literal.
var logCall = regexp.MustCompile(`\blog\.(Debug|Info|Warn|Error)\(\s*"((?:pglock|leases|fencing): [^"]*)"`)

// TestLogMessagesDocumented: every message the libraries log has its row,
// with its level, in the operator's guide's table of logs, where operators
// look up what a line means.
func TestLogMessagesDocumented(t *testing.T) {
	r := root(t)
	guide, err := os.ReadFile(filepath.Join(r, "docs", "operators.md"))
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, pkg := range []string{"pglock", "leases", "fencing"} {
		files, err := filepath.Glob(filepath.Join(r, pkg, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range logCall.FindAllStringSubmatch(string(src), -1) {
				found++
				row := "| `" + m[2] + "` | " + m[1] + " |"
				if !strings.Contains(string(guide), row) {
					t.Errorf("%s: %s %q has no row %q in docs/operators.md's table of logs", filepath.Base(f), m[1], m[2], row)
				}
			}
		}
	}
	if found < 10 {
		t.Fatalf("found %d log calls; the pattern no longer matches the code", found)
	}
}
