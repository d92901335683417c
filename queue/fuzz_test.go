package queue

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func FuzzEncodePayload(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `[1,2]`, `"x"`, `{"a":"\u0000"}`, `{"a":"\\u0000"}`, `{nope`, ``, `null`, "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := encodePayload(json.RawMessage(b), 1<<20)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
		var v any
		if json.Unmarshal(out, &v) == nil {
			if strings.Contains(fmt.Sprintf("%v", v), "\x00") {
				t.Fatalf("accepted a NUL character jsonb cannot store: %q", b)
			}
		}
	})
}

func FuzzValidateNames(f *testing.F) {
	for _, s := range []string{"default", "a.b-c_d", "", "A", `x"; drop table y; --`, "q|1", strings.Repeat("q", 64), "ünï", "a b", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateQueue(s) == nil {
			if len(s) == 0 || len(s) > MaxQueueLen || strings.ContainsAny(s, "|\"'; \x00") || strings.ToLower(s) != s {
				t.Fatalf("accepted queue %q", s)
			}
			// A valid queue round-trips through a wake payload.
			if q, d := parseWake(s + "|25"); q != s || d.Milliseconds() != 25 {
				t.Fatalf("wake payload for %q parsed as %q %s", s, q, d)
			}
		}
		if ValidateKind(s) == nil {
			if s == "" || len(s) > MaxKindLen || !utf8.ValidString(s) || strings.ContainsAny(s, " \x00\n\t") {
				t.Fatalf("accepted kind %q", s)
			}
		}
	})
}

func FuzzParseWake(f *testing.F) {
	for _, s := range []string{"default", "default|100", "a|", "|5", "a|-1", "a|99999999999999999999", "a|1|2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, d := parseWake(s)
		if d < 0 {
			t.Fatalf("negative delay from %q", s)
		}
	})
}

func FuzzTruncateError(f *testing.F) {
	f.Add("boom", 64)
	f.Add(strings.Repeat("é", 100), 65)
	f.Add("a\x00b\xffc", 64)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 64 || n > 1<<16 {
			return
		}
		out := truncateError(s, n)
		if len(out) > n || !utf8.ValidString(out) || strings.Contains(out, "\x00") {
			t.Fatalf("truncateError(%q, %d) = %q", s, n, out)
		}
	})
}
