package queue

// Job states, as stored in the jobs table.
const (
	StatePending   = "pending"
	StateRunning   = "running" // leased mode only: claimed, lease held
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateCancelled = "cancelled"
)

// Event types appended to the events table.
const (
	EventEnqueued       = "enqueued"
	EventStarted        = "started" // leased mode: claimed, attempt counted
	EventSucceeded      = "succeeded"
	EventRetryScheduled = "retry_scheduled"
	EventFailed         = "failed"
	EventCancelled      = "cancelled"
	EventRetried        = "retried" // a failed job was put back to pending by Retry
	EventSnoozed        = "snoozed" // its handler returned Snooze: pending again, attempt not counted
)

// transitions is the one table of what each event type leaves a job in.
// Every event's attempt field is the job's attempts after the change.
var transitions = map[string]string{
	EventEnqueued:       StatePending,
	EventStarted:        StateRunning,
	EventSucceeded:      StateSucceeded,
	EventRetryScheduled: StatePending,
	EventFailed:         StateFailed,
	EventCancelled:      StateCancelled,
	EventRetried:        StatePending,
	EventSnoozed:        StatePending,
}

// StateAfter returns the state a job is in after an event of type
// eventType; ok is false for a type pgwake does not write.
func StateAfter(eventType string) (state string, ok bool) {
	state, ok = transitions[eventType]
	return state, ok
}
