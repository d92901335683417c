package ui

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// The feed's own encoding of a job event is what encoding/json writes for
// it, byte for byte, for names that need escaping (markup, quotes,
// control characters, invalid UTF-8, JavaScript line separators) and
// times in any zone, with or without fractions, and years JSON refuses.
func TestJobEventEncodingMatchesJSON(t *testing.T) {
	names := []string{"", "load", "emails.send-v2", `a"b`, `back\slash`, "<script>alert(1)</script>", "a&b>c",
		"tab\there", "new\nline", "nul\x00", "\x7f", "été", "\xff\xfe", "line\u2028sep\u2029", "日本"}
	zone := time.FixedZone("x", 2*3600+30*60)
	times := []time.Time{time.Date(2026, 12, 1, 18, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 18, 0, 0, 123456000, time.UTC),
		time.Date(2026, 12, 1, 18, 0, 0, 100000000, zone), time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), time.Now(),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}
	var n int
	for i, name := range names {
		for j, at := range times {
			e := queue.EventInfo{ID: int64(i*100 + j), JobID: -int64(j), Type: queue.EventType(names[(i+j)%len(names)]),
				Queue: name, Kind: names[(i+1)%len(names)], Attempt: i - 3, At: at, Data: []byte(`{"error":"x"}`)}
			want, _ := json.Marshal(jobEventOf(e))
			require.Equal(t, string(appendFrame(nil, "job", 7, true, want)), string(appendJobFrame(nil, 7, e)), "event %+v", e)
			n++
		}
	}
	require.Equal(t, len(names)*len(times), n)
}
