package notify_test

import (
	"testing"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/notify"
)

// FuzzValidateChannel: a channel name that passes validation is a plain
// identifier (1 to 63 bytes of [a-z0-9_], no leading digit), so quoting it
// only adds the surrounding quotes and LISTEN/NOTIFY see exactly that name.
func FuzzValidateChannel(f *testing.F) {
	for _, s := range []string{"pgwake_wake", "a", "_", "", "1a", "A", `x"; LISTEN y; --`, "x'y", "a b", "a\x00b", "ünï",
		"a234567890123456789012345678901234567890123456789012345678901234", "a23456789012345678901234567890123456789012345678901234567890123"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if notify.ValidateChannel(s) != nil {
			return
		}
		if len(s) < 1 || len(s) > 63 || (s[0] >= '0' && s[0] <= '9') {
			t.Fatalf("accepted %q", s)
		}
		for i := 0; i < len(s); i++ {
			c := s[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				t.Fatalf("accepted %q with %q", s, c)
			}
		}
		if q := sqlident.Quote(s); q != `"`+s+`"` {
			t.Fatalf("%q quotes as %s", s, q)
		}
	})
}
