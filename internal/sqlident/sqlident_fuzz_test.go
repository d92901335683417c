package sqlident

import (
	"strings"
	"testing"
)

// FuzzQuote: Quote always yields one double-quoted identifier per part that
// unquotes to the part (NUL bytes, which PostgreSQL identifiers cannot hold,
// are dropped), and Validate accepts only names that need no quoting.
func FuzzQuote(f *testing.F) {
	for _, s := range []string{"jobs", `a"b`, `"`, `""`, "a\x00b", "ünï", "a.b", `x"; DROP TABLE y; --`, ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := Quote(s)
		if len(q) < 2 || q[0] != '"' || q[len(q)-1] != '"' {
			t.Fatalf("Quote(%q) = %s", s, q)
		}
		inner := q[1 : len(q)-1]
		// Every quote inside is doubled: no way out of the identifier.
		if strings.Count(strings.ReplaceAll(inner, `""`, ""), `"`) != 0 {
			t.Fatalf("Quote(%q) = %s has a lone quote", s, q)
		}
		if got := strings.ReplaceAll(inner, `""`, `"`); got != strings.ReplaceAll(s, "\x00", "") {
			t.Fatalf("Quote(%q) = %s unquotes to %q", s, q, got)
		}
		if Validate("name", s, 0) == nil && q != `"`+s+`"` {
			t.Fatalf("valid %q needed quoting: %s", s, q)
		}
	})
}
