package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/pgwake/pgwake/internal/jsonenc"
	"github.com/pgwake/pgwake/queue"
)

// Version is the version of the JSON encoding Encode writes (field "v").
const Version = 1

// Type is an event's type: what happened to the job. It is queue.EventType;
// new types may be added without a version change, so consumers must accept
// unknown types.
type Type = queue.EventType

// Event types, the values of queue.Event*.
const (
	TypeEnqueued       = queue.EventEnqueued
	TypeStarted        = queue.EventStarted
	TypeSucceeded      = queue.EventSucceeded
	TypeRetryScheduled = queue.EventRetryScheduled
	TypeFailed         = queue.EventFailed
	TypeCancelled      = queue.EventCancelled
	TypeRetried        = queue.EventRetried
	TypeSnoozed        = queue.EventSnoozed
)

// Event is one row of the event log: a job's state change.
type Event struct {
	// ID is the event's id, unique per schema and increasing per job (in
	// commit order for one job). Across jobs, id order is not commit order.
	ID int64
	// JobID is the job the event is about.
	JobID int64
	// Type is what happened (Type* constants).
	Type Type
	// Queue and Kind are the job's queue and kind.
	Queue string
	Kind  string
	// Attempt is the job's number of finished attempts after the change
	// (0 for enqueued).
	Attempt int
	// At is when the change was written.
	At time.Time
	// Error is the attempt's error text (retry_scheduled, failed, and
	// cancelled when its handler returned queue.Cancel).
	Error string
	// RunAfter is when the job is due next (enqueued, retry_scheduled,
	// retried, snoozed); nil when the event has none.
	RunAfter *time.Time
}

// wire is the JSON shape of version 1.
type wire struct {
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

// ErrDecode is wrapped by every error Decode returns.
var ErrDecode = errors.New("events: cannot decode event")

// ErrUnsupportedVersion is wrapped by Decode's error for a "v" other than 1.
var ErrUnsupportedVersion = errors.New("unsupported event encoding version")

// Encode returns the event's version 1 JSON encoding (docs/events.md).
// Times are written in UTC with nanosecond precision. The bytes are those
// of encoding/json on the wire struct; the stream encodes every event it
// forwards, so it writes them directly (TestEncodeIsJSONMarshal).
func Encode(e Event) ([]byte, error) {
	b := make([]byte, 0, 160+len(e.Queue)+len(e.Kind)+len(e.Error))
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, Version, 10)
	b = jsonenc.EventFields(b, false, e.ID, e.JobID, string(e.Type), e.Queue, e.Kind, e.Attempt)
	b = append(b, `,"at":`...)
	var err error
	if b, err = appendJSONTime(b, e.At); err != nil {
		return nil, err
	}
	if e.Error != "" {
		b = append(b, `,"error":`...)
		b = jsonenc.String(b, e.Error)
	}
	if e.RunAfter != nil {
		b = append(b, `,"run_after":`...)
		if b, err = appendJSONTime(b, *e.RunAfter); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

// appendJSONTime appends t in UTC as encoding/json writes a time.Time
// (RFC 3339 with nanoseconds, trailing zeros dropped); a year outside
// 0-9999 is an error, as there.
func appendJSONTime(b []byte, t time.Time) ([]byte, error) {
	t = t.UTC()
	if y := t.Year(); y < 0 || y > 9999 {
		return nil, fmt.Errorf("events: encode: time %v: year outside of range [0,9999]", t)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// MarshalJSON encodes e as Encode does.
func (e Event) MarshalJSON() ([]byte, error) { return Encode(e) }

// UnmarshalJSON decodes as Decode does.
func (e *Event) UnmarshalJSON(b []byte) error {
	d, err := Decode(b)
	if err != nil {
		return err
	}
	*e = d
	return nil
}

// Decode parses one encoded event. It accepts unknown fields (later minor
// additions) and unknown types, and rejects a missing or different "v",
// a missing id, job_id, type or at, and trailing data.
func Decode(b []byte) (Event, error) {
	var w struct {
		wire
		V *int `json:"v"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&w); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrDecode, err)
	}
	if dec.More() {
		return Event{}, fmt.Errorf("%w: trailing data after the event", ErrDecode)
	}
	switch {
	case w.V == nil:
		return Event{}, fmt.Errorf("%w: no version field \"v\"", ErrDecode)
	case *w.V != Version:
		return Event{}, fmt.Errorf("%w: %w %d (this decoder reads %d)", ErrDecode, ErrUnsupportedVersion, *w.V, Version)
	case w.ID <= 0:
		return Event{}, fmt.Errorf("%w: id must be positive, got %d", ErrDecode, w.ID)
	case w.JobID <= 0:
		return Event{}, fmt.Errorf("%w: job_id must be positive, got %d", ErrDecode, w.JobID)
	case w.Type == "":
		return Event{}, fmt.Errorf("%w: type is empty", ErrDecode)
	case w.At.IsZero():
		return Event{}, fmt.Errorf("%w: at is missing", ErrDecode)
	case w.Attempt < 0:
		return Event{}, fmt.Errorf("%w: attempt must not be negative, got %d", ErrDecode, w.Attempt)
	}
	e := Event{ID: w.ID, JobID: w.JobID, Type: Type(w.Type), Queue: w.Queue, Kind: w.Kind,
		Attempt: w.Attempt, At: w.At.UTC(), Error: w.Error}
	if w.RunAfter != nil {
		ra := w.RunAfter.UTC()
		e.RunAfter = &ra
	}
	return e, nil
}

// data is the shape of the events.data column.
type data struct {
	Error    string          `json:"error"`
	RunAfter json.RawMessage `json:"run_after"`
}

// setData fills Error and RunAfter from the events.data jsonb text.
func (e *Event) setData(raw []byte) error {
	if len(raw) == 0 || string(raw) == "{}" { // the column's default
		return nil
	}
	var d data
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("events: event %d: data column: %w", e.ID, err)
	}
	e.Error = d.Error
	// A run_after Go cannot hold (a year past 9999 or BC, which the SQL API
	// took before migration 0023) leaves RunAfter unset: the event is
	// still read, published and replayed.
	var ra time.Time
	if len(d.RunAfter) > 0 && string(d.RunAfter) != "null" && json.Unmarshal(d.RunAfter, &ra) == nil {
		ra = ra.UTC()
		e.RunAfter = &ra
	}
	return nil
}
