package leases

import "testing"

// A batched renewal's rows find their inputs whatever order they come in,
// and a name that was not asked about finds none.
func TestRowMatcher(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b", "c"}
	for _, c := range []struct {
		what string
		rows []string
	}{
		{"in order", []string{"a", "b", "c"}},
		{"reversed", []string{"c", "b", "a"}},
		{"one missing", []string{"a", "c"}},
		{"unknown names", []string{"x", "a", "b", "c", "y"}},
	} {
		m := rowMatcher{names: names}
		for i, name := range c.rows {
			j := m.index(i, []byte(name))
			switch {
			case name == "x" || name == "y":
				if j != -1 {
					t.Errorf("%s: row %d (%q) matched %q", c.what, i, name, names[j])
				}
			case j < 0 || names[j] != name:
				t.Errorf("%s: row %d (%q) matched input %d", c.what, i, name, j)
			}
		}
	}
}
