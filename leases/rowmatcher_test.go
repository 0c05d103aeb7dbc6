package leases

import "testing"

// A batched renewal's rows find their leases whatever order they come in,
// and a name that was not asked about finds none.
func TestRowMatcher(t *testing.T) {
	t.Parallel()
	var rs []renewal
	for _, n := range []string{"a", "b", "c"} {
		rs = append(rs, renewal{l: &Lease{name: n}})
	}
	for _, c := range []struct {
		what string
		rows []string
	}{
		{"in order", []string{"a", "b", "c"}},
		{"reversed", []string{"c", "b", "a"}},
		{"one missing", []string{"a", "c"}},
		{"unknown names", []string{"x", "a", "b", "c", "y"}},
	} {
		m := rowMatcher{rs: rs}
		for i, name := range c.rows {
			l := m.lease(i, name)
			switch {
			case name == "x" || name == "y":
				if l != nil {
					t.Errorf("%s: row %d (%q) matched %q", c.what, i, name, l.name)
				}
			case l == nil || l.name != name:
				t.Errorf("%s: row %d (%q) matched %v", c.what, i, name, l)
			}
		}
	}
}
