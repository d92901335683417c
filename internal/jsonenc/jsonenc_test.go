package jsonenc

import (
	"encoding/json"
	"testing"
)

// String writes what encoding/json writes, for plain and awkward strings.
func TestStringIsJSONMarshal(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote`, `back\slash`, "<script>&", "tab\t", "é", "\u2028", "\xff", "~\x7f"} {
		want, _ := json.Marshal(s)
		if got := String(nil, s); string(got) != string(want) {
			t.Errorf("String(%q) = %s, want %s", s, got, want)
		}
	}
}

// EventFields writes the fields in order, with a comma unless first.
func TestEventFields(t *testing.T) {
	got := string(EventFields([]byte("{"), true, 1, 2, "enqueued", "q<", "k", 3)) + "}"
	want := `{"id":1,"job_id":2,"type":"enqueued","queue":"q\u003c","kind":"k","attempt":3}`
	if got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	if got := string(EventFields([]byte(`{"v":1`), false, 1, 2, "t", "q", "k", 0)); got != `{"v":1,"id":1,"job_id":2,"type":"t","queue":"q","kind":"k","attempt":0` {
		t.Errorf("not first: %s", got)
	}
}
