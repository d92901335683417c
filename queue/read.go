package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// JobInfo is a job as the read API returns it.
type JobInfo struct {
	ID          int64      `json:"id"`
	Queue       string     `json:"queue"`
	Kind        string     `json:"kind"`
	State       JobState   `json:"state"`
	Priority    int        `json:"priority"`
	Attempts    int        `json:"attempts"`
	MaxAttempts int        `json:"max_attempts"`
	RunAfter    time.Time  `json:"run_after"`
	CreatedAt   time.Time  `json:"created_at"`
	FinishedAt  *time.Time `json:"finished_at,omitempty"`
	UniqueKey   string     `json:"unique_key,omitempty"`
	// UniqueScope is what UniqueKey is unique within (UniqueByKind or
	// UniqueByQueue); empty when the job has no unique key.
	UniqueScope UniqueScope `json:"unique_scope,omitempty"`
	// UniqueHold is which of the key's jobs hold it (UniqueHoldActive,
	// UniqueHoldPending, UniqueHoldSucceeded, or UniqueHoldPeriod for a job
	// enqueued with a UniquePeriod); empty when the job has no unique key.
	UniqueHold UniqueHold `json:"unique_hold,omitempty"`
	// HeldUntil is, for a job enqueued with a UniquePeriod, when its
	// period ends (past: it has ended); nil otherwise, and once retention
	// deleted the ended period's record or a later job took the key.
	HeldUntil *time.Time `json:"held_until,omitempty"`
	LastError string     `json:"last_error,omitempty"`
	// Metadata is the job's metadata as its handler gets it (Job.Metadata,
	// e.g. a trace context); nil when it has none. A value that is not a
	// JSON object of strings (written by hand through the SQL API) reads as
	// none, as in the worker.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Payload is set by JobGet, and by JobList when
	// JobListParams.WithPayload is set.
	Payload json.RawMessage `json:"payload,omitempty"`
}

// EventInfo is one row of the event log.
type EventInfo struct {
	ID      int64           `json:"id"`
	JobID   int64           `json:"job_id"`
	Type    EventType       `json:"type"`
	Queue   string          `json:"queue"`
	Kind    string          `json:"kind"`
	Attempt int             `json:"attempt"`
	At      time.Time       `json:"at"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// JobListParams filters and pages JobList. The zero value lists the newest
// DefaultJobListLimit jobs.
type JobListParams struct {
	// State keeps jobs in this state (State* constants). Default: any.
	State JobState
	// Queue keeps jobs of this queue. Default: any.
	Queue string
	// Kind keeps jobs of this kind. Default: any.
	Kind string
	// CreatedAfter keeps jobs created at or after it. Default: no bound.
	CreatedAfter time.Time
	// CreatedBefore keeps jobs created before it. Default: no bound.
	CreatedBefore time.Time
	// ErrorContains keeps jobs whose last error contains it, ignoring case
	// (at most MaxErrorFilterLen bytes). Default: any.
	ErrorContains string
	// PayloadContains keeps jobs whose payload contains it as jsonb's @>
	// does (every key given must match; others may be there). It must be
	// valid JSON. Default: any payload.
	PayloadContains json.RawMessage
	// WithPayload sets each JobInfo's Payload. Default: without payloads.
	WithPayload bool
	// Before is the keyset cursor: only jobs with an id below it (a
	// JobListPage's Next). Default 0: from the newest.
	Before int64
	// Limit is the most jobs returned, 1 to MaxJobListLimit. Default
	// DefaultJobListLimit.
	Limit int
}

// Limits of JobListParams.
const (
	DefaultJobListLimit = 50
	MaxJobListLimit     = 1000
	MaxErrorFilterLen   = 200
)

// JobListPage is one page of JobList, newest first.
type JobListPage struct {
	Jobs []JobInfo `json:"jobs"`
	// Next is the Before of the following page; 0 when this page is the last.
	Next int64 `json:"next,omitempty"`
}

// FilterError is a read API filter that was rejected before any SQL ran.
type FilterError struct {
	Field  string // the JobListParams field, e.g. "State"
	Reason string
}

func (e *FilterError) Error() string {
	return fmt.Sprintf("queue: bad filter %s: %s", e.Field, e.Reason)
}

// validate fills p's defaults and checks it.
func (p *JobListParams) validate() error {
	if p.State != "" {
		if !slices.Contains(States(), p.State) {
			return &FilterError{Field: "State", Reason: fmt.Sprintf("%q is not one of %v", p.State, States())}
		}
	}
	if len(p.Queue) > 1000 {
		return &FilterError{Field: "Queue", Reason: "longer than 1000 bytes"}
	}
	if len(p.Kind) > 1000 {
		return &FilterError{Field: "Kind", Reason: "longer than 1000 bytes"}
	}
	if len(p.ErrorContains) > MaxErrorFilterLen {
		return &FilterError{Field: "ErrorContains", Reason: fmt.Sprintf("longer than %d bytes", MaxErrorFilterLen)}
	}
	for _, f := range []struct{ name, v string }{{"Queue", p.Queue}, {"Kind", p.Kind}, {"ErrorContains", p.ErrorContains}} {
		for i := 0; i < len(f.v); i++ {
			if f.v[i] == 0 {
				return &FilterError{Field: f.name, Reason: "contains a NUL byte"}
			}
		}
		if !utf8.ValidString(f.v) {
			return &FilterError{Field: f.name, Reason: "not valid UTF-8"}
		}
	}
	if p.PayloadContains != nil {
		// What jsonb refuses although json.Valid accepts it (invalid UTF-8,
		// \u0000, a lone surrogate, a number beyond numeric) is a bad
		// filter too, not an SQL error (TestReadFiltersJsonbAndTimeRange).
		if !json.Valid(p.PayloadContains) || !utf8.Valid(p.PayloadContains) {
			return &FilterError{Field: "PayloadContains", Reason: "not valid JSON"}
		}
		if err := jsonbSafe(p.PayloadContains); err != nil {
			return &FilterError{Field: "PayloadContains", Reason: err.Error()}
		}
	}
	for _, f := range []struct {
		name string
		t    time.Time
	}{{"CreatedAfter", p.CreatedAfter}, {"CreatedBefore", p.CreatedBefore}} {
		// Beyond them pgx's microseconds overflow or PostgreSQL refuses it.
		if y := f.t.UTC().Year(); !f.t.IsZero() && (y < 1 || y > 9999) {
			return &FilterError{Field: f.name, Reason: fmt.Sprintf("%s is outside years 1..9999 (UTC)", f.t)}
		}
	}
	if !p.CreatedAfter.IsZero() && !p.CreatedBefore.IsZero() && !p.CreatedAfter.Before(p.CreatedBefore) {
		return &FilterError{Field: "CreatedBefore", Reason: "not after CreatedAfter"}
	}
	if p.Before < 0 {
		return &FilterError{Field: "Before", Reason: "negative"}
	}
	if p.Limit == 0 {
		p.Limit = DefaultJobListLimit
	}
	if p.Limit < 1 || p.Limit > MaxJobListLimit {
		return &FilterError{Field: "Limit", Reason: fmt.Sprintf("%d is not in 1..%d", p.Limit, MaxJobListLimit)}
	}
	return nil
}

func scanJobInfo(row pgx.Row, j *JobInfo, extra ...any) error {
	var prio int16
	var meta *string
	dest := append([]any{&j.ID, &j.Queue, &j.Kind, &j.State, &prio, &j.Attempts, &j.MaxAttempts, &j.RunAfter,
		&j.CreatedAt, &j.FinishedAt, &j.UniqueKey, &j.UniqueScope, &j.UniqueHold, &j.LastError, &meta, &j.HeldUntil}, extra...)
	err := row.Scan(dest...)
	j.Priority = int(prio)
	if err == nil && meta != nil {
		j.Metadata = decodeMetadata(*meta)
	}
	return err
}

// JobGet returns job id with its payload; ErrNotFound when no row has that
// id (retention may have deleted it: JobEvents still has its history).
func (c *Client) JobGet(ctx context.Context, id int64) (JobInfo, error) {
	var j JobInfo
	err := scanJobInfo(c.pool.QueryRow(ctx, c.sql.read.jobGet, id), &j, &j.Payload)
	if errors.Is(err, pgx.ErrNoRows) {
		return JobInfo{}, fmt.Errorf("queue: job %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return JobInfo{}, fmt.Errorf("queue: get job %d: %w", id, c.notMigrated(err))
	}
	return j, nil
}

// JobList returns the newest jobs matching p, without payloads unless
// p.WithPayload, and the cursor of the next page. Pages are stable under
// concurrent enqueues: a new job has a higher id than every page's cursor.
// A bad filter returns a *FilterError before any SQL runs.
func (c *Client) JobList(ctx context.Context, p JobListParams) (JobListPage, error) {
	return c.jobList(ctx, c.pool, p)
}

// JobListTx is JobList inside tx: it sees the jobs tx enqueued or changed
// before it commits (pgwaketest.RequireEnqueuedTx uses it).
func (c *Client) JobListTx(ctx context.Context, tx pgx.Tx, p JobListParams) (JobListPage, error) {
	if tx == nil {
		return JobListPage{}, fmt.Errorf("%w: nil transaction", ErrInvalidConfig)
	}
	return c.jobList(ctx, tx, p)
}

// ceilMicrosecond rounds t up to a whole microsecond.
func ceilMicrosecond(t time.Time) time.Time {
	u := t.Truncate(time.Microsecond)
	if u.Before(t) {
		u = u.Add(time.Microsecond)
	}
	return u
}

func (c *Client) jobList(ctx context.Context, q querier, p JobListParams) (JobListPage, error) {
	if err := p.validate(); err != nil {
		return JobListPage{}, err
	}
	// created_at counts microseconds, and pgx truncates a bound to them:
	// at or after X, and before X, are at or after, and before, X rounded
	// up (TestCreatedBoundsBelowAMicrosecond).
	var after, before *time.Time
	if !p.CreatedAfter.IsZero() {
		a := ceilMicrosecond(p.CreatedAfter)
		after = &a
	}
	if !p.CreatedBefore.IsZero() {
		b := ceilMicrosecond(p.CreatedBefore)
		before = &b
	}
	var contains *string
	if p.PayloadContains != nil {
		s := string(p.PayloadContains)
		contains = &s
	}
	rows, err := q.Query(ctx, c.sql.read.jobList, p.State, p.Queue, p.Kind, after, before, p.ErrorContains, p.Before, p.Limit+1,
		contains, p.WithPayload)
	if err != nil {
		return JobListPage{}, fmt.Errorf("queue: list jobs: %w", c.notMigrated(err))
	}
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (JobInfo, error) {
		var j JobInfo
		return j, scanJobInfo(r, &j, &j.Payload)
	})
	if err != nil {
		return JobListPage{}, fmt.Errorf("queue: list jobs: %w", c.notMigrated(err))
	}
	page := JobListPage{Jobs: jobs}
	if len(jobs) > p.Limit {
		page.Jobs = jobs[:p.Limit]
		page.Next = page.Jobs[p.Limit-1].ID
	}
	if page.Jobs == nil {
		page.Jobs = []JobInfo{}
	}
	return page, nil
}

func collectEvents(rows pgx.Rows) ([]EventInfo, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventInfo, error) {
		var e EventInfo
		err := r.Scan(&e.ID, &e.JobID, &e.Type, &e.Queue, &e.Kind, &e.Attempt, &e.At, &e.Data)
		return e, err
	})
}

// JobEvents returns job id's event history, oldest first (empty: no such
// job, or its events were pruned).
func (c *Client) JobEvents(ctx context.Context, id int64) ([]EventInfo, error) {
	return c.queryEvents(ctx, fmt.Sprintf("events of job %d", id), c.sql.read.jobEvents, id)
}

// JobEventsTail returns the newest n (1 to MaxJobListLimit) events of job
// id, oldest first: a bounded read of a history that snoozes and retries
// can make long (the dashboard's job page; TestJobPageShowsTheNewestEvents).
func (c *Client) JobEventsTail(ctx context.Context, id int64, n int) ([]EventInfo, error) {
	if n < 1 || n > MaxJobListLimit {
		return nil, &FilterError{Field: "n", Reason: fmt.Sprintf("%d is outside 1..%d", n, MaxJobListLimit)}
	}
	return c.queryEvents(ctx, fmt.Sprintf("events of job %d", id), c.sql.read.jobEventsTail, id, n)
}

// EventsAfter returns up to limit (1 to MaxJobListLimit) events with an id
// above afterID, in id order. Event ids are taken at insert and commit in
// any order: an event with a lower id than one already returned may still
// appear later (its transaction was slower). A reader that must not miss
// one checks the ids it skipped with EventsByID (the ui package does).
func (c *Client) EventsAfter(ctx context.Context, afterID int64, limit int) ([]EventInfo, error) {
	if limit < 1 || limit > MaxJobListLimit {
		return nil, &FilterError{Field: "limit", Reason: fmt.Sprintf("%d is not in 1..%d", limit, MaxJobListLimit)}
	}
	return c.queryEvents(ctx, fmt.Sprintf("events after %d", afterID), c.sql.read.eventsAfter, afterID, limit)
}

// EventsByID returns the events among ids (at most MaxJobListLimit) that
// exist, in id order: a reader of EventsAfter checks the ids it skipped,
// whose transactions may have committed since.
func (c *Client) EventsByID(ctx context.Context, ids []int64) ([]EventInfo, error) {
	if len(ids) > MaxJobListLimit {
		return nil, &FilterError{Field: "ids", Reason: fmt.Sprintf("more than %d", MaxJobListLimit)}
	}
	return c.queryEvents(ctx, "events by id", c.sql.read.eventsByID, ids)
}

// queryEvents runs one of the event statements and collects its rows; what
// names the read in the error.
func (c *Client) queryEvents(ctx context.Context, what, sql string, args ...any) ([]EventInfo, error) {
	rows, err := c.pool.Query(ctx, sql, args...)
	if err == nil {
		var out []EventInfo
		if out, err = collectEvents(rows); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("queue: %s: %w", what, c.notMigrated(err))
}

// LastEventID returns the highest event id committed (0: none).
func (c *Client) LastEventID(ctx context.Context) (int64, error) {
	var id int64
	if err := c.pool.QueryRow(ctx, c.sql.read.lastEventID).Scan(&id); err != nil {
		return 0, fmt.Errorf("queue: last event id: %w", c.notMigrated(err))
	}
	return id, nil
}

// EventsPrunedThrough returns the highest event id deleted by event pruning
// (events.DeleteBefore, `pgwake events prune`; 0: none). A reader that
// resumes the log after an id below it may have missed events: read after
// the events (EventsAfter), a value above the resume point means some event
// after it was deleted, before or during the read.
func (c *Client) EventsPrunedThrough(ctx context.Context) (int64, error) {
	var id int64
	if err := c.pool.QueryRow(ctx, c.sql.read.eventsPrunedThrough).Scan(&id); err != nil {
		return 0, fmt.Errorf("queue: events pruned through: %w", c.notMigrated(err))
	}
	return id, nil
}

// EventCount counts the committed events with an id above afterID (0: every
// event). It reads every such row: for benchmarks, tests and checks, not a
// dashboard's refresh.
func (c *Client) EventCount(ctx context.Context, afterID int64) (int64, error) {
	var n int64
	if err := c.pool.QueryRow(ctx, c.sql.read.eventCount, afterID).Scan(&n); err != nil {
		return 0, fmt.Errorf("queue: count events after %d: %w", afterID, c.notMigrated(err))
	}
	return n, nil
}

// EventsInSecond is how many events of one type a queue had in one whole
// second (EventsPerSecond).
type EventsInSecond struct {
	Queue  string
	Second int64 // unix seconds of the events' time (database clock)
	Count  int64
}

// EventsPerSecond counts the events of type typ written at or after since
// with an id at most upToID, per queue and whole second. It reads every
// such event (the events table's time index bounds the read to the
// window): a reader of the event log that counts its events itself, from
// the id it starts reading at (LastEventID), seeds the counts with it
// once.
func (c *Client) EventsPerSecond(ctx context.Context, typ EventType, since time.Time, upToID int64) ([]EventsInSecond, error) {
	rows, err := c.pool.Query(ctx, c.sql.read.eventsPerSecond, string(typ), since, upToID)
	if err != nil {
		return nil, fmt.Errorf("queue: events per second: %w", c.notMigrated(err))
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (EventsInSecond, error) {
		var e EventsInSecond
		err := r.Scan(&e.Queue, &e.Second, &e.Count)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue: events per second: %w", c.notMigrated(err))
	}
	return out, nil
}

// EventsChannel is the channel that transactions writing events NOTIFY
// while a watcher is registered (WatchEvents).
func EventsChannel(schema string) string { return schema + "_events" }

// WatchEvents registers (or refreshes) watcher id: for the next 60 seconds,
// a transaction that writes events sends, at its commit, one NOTIFY on
// EventsChannel(schema), payload empty, unless another commit sent one less
// than 25 ms before (migration 0017). A watcher therefore reads the event
// log once more some time after each notification (the dashboard: 50 ms),
// and again while reads find new events. Call WatchEvents again well within
// a minute to keep watching; UnwatchEvents stops it. Without a watcher
// writing events sends nothing.
func (c *Client) WatchEvents(ctx context.Context, id string) error {
	if _, err := c.pool.Exec(ctx, c.sql.read.watch, id); err != nil {
		return fmt.Errorf("queue: watch events: %w", err)
	}
	return nil
}

// UnwatchEvents removes watcher id.
func (c *Client) UnwatchEvents(ctx context.Context, id string) error {
	if _, err := c.pool.Exec(ctx, c.sql.read.unwatch, id); err != nil {
		return fmt.Errorf("queue: unwatch events: %w", err)
	}
	return nil
}

// QueueStat is one queue's counters, as `pgwake stats --json` prints them.
type QueueStat struct {
	Queue string `json:"queue"`
	// Pending is due jobs waiting for a worker.
	Pending int64 `json:"pending"`
	// Scheduled is pending jobs not due yet.
	Scheduled int64 `json:"scheduled"`
	// Running is leased jobs running and held attempts in flight (an
	// attempt record: includes attempts of a crashed worker until they are
	// recovered).
	Running int64 `json:"running"`
	// Failed is jobs whose attempts ran out.
	Failed int64 `json:"failed"`
	// SucceededLastMinute is jobs that succeeded in the last minute.
	SucceededLastMinute int64 `json:"succeeded_last_minute"`
	// OldestPendingAgeSec is how long the oldest due job has been due.
	OldestPendingAgeSec float64 `json:"oldest_pending_age_seconds"`
	// Paused is whether the queue is paused.
	Paused bool `json:"paused"`
	// Estimated names the counters that were above the exact limit and are
	// the planner's estimate (at least the limit), e.g. ["pending"].
	Estimated []string `json:"estimated,omitempty"`
}

// QueueStatsParams tunes QueueStats.
type QueueStatsParams struct {
	// ExactLimit is how many rows each counter counts exactly, per queue;
	// above it the counter is the planner's estimate (statistics kept by
	// ANALYZE, see migration 0015) and named in QueueStat.Estimated.
	// Default DefaultExactLimit; -1: count everything exactly (reads every
	// matching row).
	ExactLimit int
	// SkipSucceeded leaves SucceededLastMinute 0 and lists no queue for
	// its recently succeeded jobs alone, for a caller that counts them
	// itself from the event log (EventsPerSecond, then the events it
	// reads), as the dashboard does: counting them is most of the
	// statement's work when many jobs succeed.
	SkipSucceeded bool
}

// DefaultExactLimit is QueueStatsParams.ExactLimit's default.
const DefaultExactLimit = 10000

// QueueStats returns the counters of every queue with pending, running,
// failed or recently succeeded jobs, or paused, in name order. Its cost
// grows with the exact limit and the number of queues and priorities, not
// with the number of jobs.
func (c *Client) QueueStats(ctx context.Context, p QueueStatsParams) ([]QueueStat, error) {
	limit := p.ExactLimit
	switch {
	case limit == 0:
		limit = DefaultExactLimit
	case limit == -1:
		limit = 1 << 30
	case limit < 0:
		return nil, &FilterError{Field: "ExactLimit", Reason: "negative (use -1 for no limit)"}
	}
	// Count one past the limit: a count above it is known to be capped
	// (math.MaxInt as "no limit" must not overflow: TestReadFiltersMisused).
	capRows := min(limit, 1<<30-1) + 1
	stmt := c.sql.read.stats
	if p.SkipSucceeded {
		stmt = c.sql.read.statsNoSucceeded
	}
	rows, err := c.pool.Query(ctx, stmt, capRows)
	if err != nil {
		return nil, fmt.Errorf("queue: stats: %w", c.notMigrated(err))
	}
	var succeededTotal int64
	due := map[string]int64{}  // pending rows due, held attempts included
	held := map[string]int64{} // held attempts in flight
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (QueueStat, error) {
		var s QueueStat
		var d, leased, h int64
		var oldest *float64
		err := r.Scan(&s.Queue, &d, &s.Scheduled, &leased, &h, &s.Failed, &s.SucceededLastMinute, &oldest, &s.Paused)
		due[s.Queue], held[s.Queue] = d, h
		s.Pending = max(d-h, 0)
		s.Running = leased + h
		if oldest != nil {
			s.OldestPendingAgeSec = max(*oldest, 0)
		}
		succeededTotal += s.SucceededLastMinute
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("queue: stats: %w", c.notMigrated(err))
	}
	if p.ExactLimit != -1 {
		for i := range out {
			s := &out[i]
			for _, e := range []struct {
				name  string
				n     *int64
				over  bool
				query string
				minus int64 // rows the estimate counts that n does not
			}{
				// Pending leaves out the held attempts, which the due count
				// (counted up to the limit plus them) and the estimate hold.
				{"pending", &s.Pending, due[s.Queue]-held[s.Queue] > int64(limit), c.sql.read.estimatePending, held[s.Queue]},
				{"scheduled", &s.Scheduled, s.Scheduled > int64(limit), c.sql.read.estimateScheduled, 0},
				{"failed", &s.Failed, s.Failed > int64(limit), c.sql.read.estimateFailed, 0},
				{"succeeded_last_minute", &s.SucceededLastMinute, succeededTotal > int64(limit), c.sql.read.estimateSucceeded, 0},
			} {
				if !e.over {
					continue
				}
				est, err := c.estimate(ctx, e.query, s.Queue)
				if err != nil {
					return nil, err
				}
				*e.n = max(est-e.minus, *e.n)
				s.Estimated = append(s.Estimated, e.name)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Queue < out[j].Queue })
	if out == nil {
		out = []QueueStat{}
	}
	return out, nil
}

// estimate is the planner's row count for an EXPLAIN statement of queue.
func (c *Client) estimate(ctx context.Context, query, queue string) (int64, error) {
	var doc []byte
	if err := c.pool.QueryRow(ctx, query, queue).Scan(&doc); err != nil {
		return 0, fmt.Errorf("queue: stats estimate: %w", err)
	}
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(doc, &plan); err != nil || len(plan) == 0 {
		return 0, fmt.Errorf("queue: stats estimate: unexpected plan %.200q", doc)
	}
	return int64(plan[0].Plan.Rows), nil
}
