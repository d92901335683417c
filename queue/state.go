package queue

import "slices"

// JobState is a job's state, as stored in the jobs table's state column.
type JobState string

// Job states.
const (
	StatePending   JobState = "pending"
	StateRunning   JobState = "running" // leased mode only: claimed, lease held
	StateSucceeded JobState = "succeeded"
	StateFailed    JobState = "failed"
	StateCancelled JobState = "cancelled"
)

// States lists every job state, in the order a job usually moves through them.
func States() []JobState {
	return []JobState{StatePending, StateRunning, StateSucceeded, StateFailed, StateCancelled}
}

// Finished reports whether s is a final state (succeeded, failed or
// cancelled); only Retry moves a failed job on.
func (s JobState) Finished() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// EventType is the type of a row of the events table: what happened to a job.
type EventType string

// Event types appended to the events table.
const (
	EventEnqueued       EventType = "enqueued"
	EventStarted        EventType = "started" // leased mode: claimed, attempt counted
	EventSucceeded      EventType = "succeeded"
	EventRetryScheduled EventType = "retry_scheduled"
	EventFailed         EventType = "failed"
	EventCancelled      EventType = "cancelled"
	EventRetried        EventType = "retried" // a failed job was put back to pending by Retry
	EventSnoozed        EventType = "snoozed" // its handler returned Snooze: pending again, attempt not counted
)

// Transition is one row of the state machine: an event of type Event moves
// a job from one of the states From to the state To. Enqueued has no From:
// it creates the job.
type Transition struct {
	Event EventType
	From  []JobState
	To    JobState
}

// attempted is where an attempt can end: pending (held mode, the claim is
// not committed) or running (leased mode).
var attempted = []JobState{StatePending, StateRunning}

// transitions is the one table of the state machine. The executor derives a
// failed attempt's state from its event with it, events.Rebuild and Verify
// replay the log with it, and the tests check the SQL against it. Every
// event's attempt field is the job's attempts after the change.
var transitions = []Transition{
	{Event: EventEnqueued, To: StatePending},
	{Event: EventStarted, From: []JobState{StatePending}, To: StateRunning},
	{Event: EventSucceeded, From: attempted, To: StateSucceeded},
	{Event: EventRetryScheduled, From: attempted, To: StatePending},
	{Event: EventSnoozed, From: attempted, To: StatePending},
	{Event: EventFailed, From: attempted, To: StateFailed},
	{Event: EventCancelled, From: attempted, To: StateCancelled},
	{Event: EventRetried, From: []JobState{StateFailed}, To: StatePending},
}

// Transitions returns the state machine's table, one row per event type.
func Transitions() []Transition {
	out := make([]Transition, len(transitions))
	for i, t := range transitions {
		t.From = slices.Clone(t.From)
		out[i] = t
	}
	return out
}

// StateAfter returns the state a job is in after an event of type e; ok is
// false for a type pgwake does not write.
func StateAfter(e EventType) (state JobState, ok bool) {
	for _, t := range transitions {
		if t.Event == e {
			return t.To, true
		}
	}
	return "", false
}

// Next returns the state an event of type e moves a job in state from to;
// ok is false when the table has no such transition (for enqueued, from
// must be "": there is no job before it).
func Next(from JobState, e EventType) (to JobState, ok bool) {
	for _, t := range transitions {
		if t.Event != e {
			continue
		}
		if (from == "" && t.From == nil) || slices.Contains(t.From, from) {
			return t.To, true
		}
		return "", false
	}
	return "", false
}
