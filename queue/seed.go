package queue

import (
	"context"
	"fmt"
	"time"
)

// FinishedSeed describes the jobs Client.SeedFinished writes.
type FinishedSeed struct {
	// Count is how many jobs (or, with EventsOnly, events). At least 1.
	Count int
	// Queue of every job. Default DefaultQueue.
	Queue string
	// Kind of every job. Required.
	Kind string
	// State is the final state: StateSucceeded, StateFailed or
	// StateCancelled. Required.
	State JobState
	// FinishedAt is when job 0 finished; job i finished (i mod Cycle) ×
	// Spacing before it, and was created and due a minute before it
	// finished. Default: now.
	FinishedAt time.Time
	// Spacing between finish times. Default 0: all at FinishedAt.
	Spacing time.Duration
	// Cycle wraps the spacing (see FinishedAt). Default Count.
	Cycle int
	// LastError is every job's last error, and the error of its final
	// event. Default: none.
	LastError string
	// SeqPayload gives job i the payload {"seq": -(i+1)} (what the bench's
	// handlers read) instead of {}.
	SeqPayload bool
	// Events says which events each job gets. Default SeedNoEvents.
	Events SeedEvents
	// EventsOnly writes only the final events, of jobs -1..-Count that
	// have no row: the history retention leaves behind. Events, SeqPayload
	// are then ignored.
	EventsOnly bool
}

// SeedEvents is the events SeedFinished writes with each job.
type SeedEvents int

// The events of a seeded job.
const (
	SeedNoEvents   SeedEvents = iota // no event
	SeedFinalEvent                   // the event of its final state
	SeedAllEvents                    // enqueued, then the final event
)

// SeedFinished writes s.Count finished jobs straight into the jobs table,
// with the events s.Events asks for, in one statement, and returns how many
// rows it wrote. It is for benchmarks and tests that need a large history
// fast (retention, event pruning, claims behind finished rows): it skips
// enqueue's checks, hooks, unique keys, metrics and notifications, and its
// rows record no work that ran. Do not use it to record real jobs.
func (c *Client) SeedFinished(ctx context.Context, s FinishedSeed) (int64, error) {
	if s.Count < 1 || s.Kind == "" || !s.State.Finished() || s.Events < SeedNoEvents || s.Events > SeedAllEvents {
		return 0, fmt.Errorf("%w: seed of %d jobs of kind %q in state %q, events %d", ErrInvalidConfig, s.Count, s.Kind, s.State, s.Events)
	}
	if s.Queue == "" {
		s.Queue = DefaultQueue
	}
	if s.FinishedAt.IsZero() {
		s.FinishedAt = time.Now()
	}
	if s.Cycle < 1 {
		s.Cycle = s.Count
	}
	var lastError *string
	if s.LastError != "" {
		lastError = &s.LastError
	}
	args := []any{s.Queue, s.Kind, string(s.State), s.Count, s.FinishedAt, float64(s.Spacing.Microseconds()), s.Cycle, lastError}
	stmt := c.sql.seed.events
	if !s.EventsOnly {
		stmt = c.sql.seed.jobs
		args = append(args, s.SeqPayload, int(s.Events))
	}
	var n int64
	if err := c.pool.QueryRow(ctx, stmt, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("queue: seed %d %s jobs: %w", s.Count, s.State, err)
	}
	return n, nil
}

// VacuumAnalyze runs VACUUM ANALYZE on the jobs and events tables. It is for
// benchmarks: after a bulk write (SeedFinished, a large EnqueueMany) the
// measurement that follows then meets fresh statistics and no autovacuum.
func (c *Client) VacuumAnalyze(ctx context.Context) error {
	for _, stmt := range []string{c.sql.seed.vacuumJobs, c.sql.seed.vacuumEvents} {
		if _, err := c.pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("queue: vacuum: %w", err)
		}
	}
	return nil
}
