package events_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	ra := time.Date(2026, 11, 29, 15, 0, 0, 123456000, time.UTC)
	for _, e := range []events.Event{
		{ID: 1, JobID: 7, Type: events.TypeEnqueued, Queue: "default", Kind: "email", At: ra.Add(-time.Second), RunAfter: &ra},
		{ID: 2, JobID: 7, Type: events.TypeRetryScheduled, Queue: "default", Kind: "email", Attempt: 1, At: ra, Error: "boom \"quoted\"\n", RunAfter: &ra},
		{ID: 3, JobID: 7, Type: events.TypeFailed, Queue: "q", Kind: "k", Attempt: 5, At: ra, Error: "x"},
		{ID: 4, JobID: 8, Type: events.TypeSucceeded, Queue: "q", Kind: "k", Attempt: 1, At: ra},
		{ID: 5, JobID: 9, Type: "a_future_type", Queue: "q", Kind: "k", At: ra},
	} {
		b, err := events.Encode(e)
		require.NoError(t, err)
		got, err := events.Decode(b)
		require.NoError(t, err, string(b))
		require.Equal(t, e, got)
	}
}

// The encoding is a public contract (docs/events.md): this is its exact shape.
func TestEncodeContract(t *testing.T) {
	t.Parallel()
	ra := time.Date(2026, 11, 29, 15, 0, 30, 0, time.FixedZone("x", 3600))
	e := events.Event{ID: 42, JobID: 7, Type: events.TypeRetryScheduled, Queue: "default", Kind: "email",
		Attempt: 1, At: time.Date(2026, 11, 29, 14, 0, 0, 500, time.UTC), Error: "smtp: timeout", RunAfter: &ra}
	b, err := events.Encode(e)
	require.NoError(t, err)
	require.Equal(t, `{"v":1,"id":42,"job_id":7,"type":"retry_scheduled","queue":"default","kind":"email","attempt":1,`+
		`"at":"2026-11-29T14:00:00.0000005Z","error":"smtp: timeout","run_after":"2026-11-29T14:00:30Z"}`, string(b))
	// json.Marshal of an Event is the same encoding.
	b2, err := json.Marshal(e)
	require.NoError(t, err)
	require.Equal(t, string(b), string(b2))
	var back events.Event
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, int64(42), back.ID)
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"not json":   `nope`,
		"no version": `{"id":1,"job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`,
		"version 2":  `{"v":2,"id":1,"job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`,
		"no id":      `{"v":1,"job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`,
		"no job":     `{"v":1,"id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`,
		"no type":    `{"v":1,"id":1,"job_id":1,"at":"2026-01-01T00:00:00Z"}`,
		"no at":      `{"v":1,"id":1,"job_id":1,"type":"enqueued"}`,
		"negative":   `{"v":1,"id":1,"job_id":1,"type":"enqueued","attempt":-1,"at":"2026-01-01T00:00:00Z"}`,
		"trailing":   `{"v":1,"id":1,"job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"} {}`,
		"wrong type": `{"v":1,"id":"1","job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`,
		"bad time":   `{"v":1,"id":1,"job_id":1,"type":"enqueued","at":"yesterday"}`,
	} {
		_, err := events.Decode([]byte(in))
		require.ErrorIs(t, err, events.ErrDecode, name)
	}
	_, err := events.Decode([]byte(`{"v":2,"id":1,"job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`))
	require.ErrorIs(t, err, events.ErrUnsupportedVersion)
	// Unknown fields are accepted: later additions within version 1.
	e, err := events.Decode([]byte(`{"v":1,"id":1,"job_id":2,"type":"enqueued","at":"2026-01-01T00:00:00Z","new_field":[1]}`))
	require.NoError(t, err)
	require.Equal(t, int64(2), e.JobID)
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"v":1,"id":42,"job_id":7,"type":"retry_scheduled","queue":"default","kind":"email","attempt":1,"at":"2026-11-29T14:00:00.0000005Z","error":"smtp: timeout","run_after":"2026-11-29T14:00:30Z"}`))
	f.Add([]byte(`{"v":1,"id":1,"job_id":1,"type":"enqueued","at":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := events.Decode(b)
		if err != nil {
			require.ErrorIs(t, err, events.ErrDecode)
			return
		}
		// Whatever decodes re-encodes and decodes to the same event.
		b2, err := events.Encode(e)
		require.NoError(t, err)
		e2, err := events.Decode(b2)
		require.NoError(t, err)
		require.Equal(t, e, e2)
	})
}

// v1 is the version 1 shape as encoding/json writes it: Encode must
// produce exactly these bytes.
type v1 struct {
	V        int        `json:"v"`
	ID       int64      `json:"id"`
	JobID    int64      `json:"job_id"`
	Type     string     `json:"type"`
	Queue    string     `json:"queue"`
	Kind     string     `json:"kind"`
	Attempt  int        `json:"attempt"`
	At       time.Time  `json:"at"`
	Error    string     `json:"error,omitempty"`
	RunAfter *time.Time `json:"run_after,omitempty"`
}

func requireEncodeIsJSONMarshal(t *testing.T, e events.Event) {
	t.Helper()
	w := v1{V: 1, ID: e.ID, JobID: e.JobID, Type: string(e.Type), Queue: e.Queue, Kind: e.Kind, Attempt: e.Attempt, At: e.At.UTC(), Error: e.Error}
	if e.RunAfter != nil {
		ra := e.RunAfter.UTC()
		w.RunAfter = &ra
	}
	want, werr := json.Marshal(w)
	got, err := events.Encode(e)
	if werr != nil {
		require.Error(t, err, "encoding/json refused %+v", e)
		return
	}
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
}

func TestEncodeIsJSONMarshal(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 8, 0, 0, 123456789, time.FixedZone("x", -7200))
	ra := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	far := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, s := range []string{"", "default", "a\"b", `back\slash`, "<script>&", "tab\there", "new\nline", "\x00\x1f\x7f",
		"héllo", "\u2028\u2029", "bad \xff utf-8", "日本語", "emoji 😀"} {
		requireEncodeIsJSONMarshal(t, events.Event{ID: 1, JobID: 2, Type: events.Type(s + "t"), Queue: s, Kind: s, Attempt: 3, At: at, Error: s, RunAfter: &ra})
		requireEncodeIsJSONMarshal(t, events.Event{ID: 1 << 62, JobID: -5, Type: events.TypeSucceeded, Queue: "q", Kind: s, At: at.Truncate(time.Second)})
	}
	requireEncodeIsJSONMarshal(t, events.Event{ID: 1, JobID: 1, Type: events.TypeEnqueued, At: far})
	requireEncodeIsJSONMarshal(t, events.Event{ID: 1, JobID: 1, Type: events.TypeEnqueued, At: at, RunAfter: &far})
}

func FuzzEncodeIsJSONMarshal(f *testing.F) {
	f.Add(int64(1), "default", "email", "smtp: timeout", int64(1764576000123456789), true)
	f.Add(int64(7), "<a&b>", "\u2028", "\xff", int64(0), false)
	f.Fuzz(func(t *testing.T, id int64, queue, kind, errText string, unixNano int64, runAfter bool) {
		at := time.Unix(0, unixNano)
		e := events.Event{ID: id, JobID: id + 1, Type: events.Type(kind), Queue: queue, Kind: kind, Attempt: len(queue), At: at, Error: errText}
		if runAfter {
			ra := at.Add(time.Duration(id))
			e.RunAfter = &ra
		}
		requireEncodeIsJSONMarshal(t, e)
	})
}
