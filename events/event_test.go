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
