package events

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// From selects where reading the log starts. The zero From reads it all.
type From struct {
	// AfterID skips events with id <= AfterID.
	AfterID int64
	// Since skips events written before Since (zero: no limit).
	Since time.Time
}

const readBatch = 5000

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func readQuery(schema string) string {
	return `SELECT id, job_id, type, queue, kind, attempt, at, data::text FROM ` + sqlident.Quote(schema, "events") +
		` WHERE id > $1 AND at >= $2 ORDER BY id LIMIT $3`
}

// readAll pages through the log in id order, calling fn for each event.
func readAll(ctx context.Context, q querier, schema string, from From, fn func(Event) error) error {
	if err := migrations.ValidateSchema(schema); err != nil {
		return err
	}
	since := from.Since
	if since.IsZero() {
		since = time.Unix(0, 0)
	}
	sql := readQuery(schema)
	after := from.AfterID
	for {
		rows, err := q.Query(ctx, sql, after, since, readBatch)
		if err != nil {
			return fmt.Errorf("events: reading the log: %w", err)
		}
		var batch []Event
		for rows.Next() {
			var e Event
			var data string
			if err := rows.Scan(&e.ID, &e.JobID, &e.Type, &e.Queue, &e.Kind, &e.Attempt, &e.At, &data); err != nil {
				rows.Close()
				return fmt.Errorf("events: reading the log: %w", err)
			}
			e.At = e.At.UTC()
			if err := e.setData([]byte(data)); err != nil {
				rows.Close()
				return err
			}
			batch = append(batch, e)
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("events: reading the log: %w", err)
		}
		for _, e := range batch {
			if err := fn(e); err != nil {
				return err
			}
		}
		if len(batch) < readBatch {
			return nil
		}
		after = batch[len(batch)-1].ID
	}
}

// Read calls fn for each event of the table selected by from, in id order
// (per job that is commit order; across jobs it is not). Read pages through
// the table in several statements; Backfill reads one consistent snapshot.
// An error from fn stops Read and is returned.
func Read(ctx context.Context, pool *pgxpool.Pool, schema string, from From, fn func(Event) error) error {
	return readAll(ctx, pool, schema, from, fn)
}

// Catchup joins a backfill read from the table with a live stream so that
// nothing is missed and every duplicate is recognised. See Backfill.
type Catchup struct {
	boundary pglogrepl.LSN
	seen     map[int64]struct{}
}

// Boundary is the WAL position past which no backfilled event can have
// committed: live events at or after it are new.
func (c *Catchup) Boundary() pglogrepl.LSN { return c.boundary }

// Live reports whether a live event (its id and commit LSN, from
// MessageEventID and MessageLSN) is new, that is not already delivered by
// the backfill. Once the live stream passes the boundary the backfill's ids
// are released.
func (c *Catchup) Live(eventID int64, commitLSN pglogrepl.LSN) bool {
	if commitLSN >= c.boundary {
		c.seen = nil
		return true
	}
	_, dup := c.seen[eventID]
	return !dup
}

// Backfill reads the events selected by from in one REPEATABLE READ
// snapshot and calls fn for each, in id order. It returns a Catchup that
// tells which live events are duplicates of backfilled ones.
//
// To switch from the table to the live stream with no gap: subscribe to the
// live messages first (buffer them), then Backfill, then deliver each
// buffered and later live message for which Catchup.Live is true. Why this
// is exact: the snapshot sees a transaction only if its commit record was
// inserted before the snapshot, and the boundary is the WAL insert position
// read after the snapshot was taken, so a live event committed at or after
// the boundary cannot be in the backfill; an event committed before it is
// in the backfill exactly when its id was seen. Event ids alone cannot be
// used as a watermark because ids are taken at insert and transactions
// commit in another order.
func Backfill(ctx context.Context, pool *pgxpool.Pool, schema string, from From, fn func(Event) error) (*Catchup, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("events: backfill: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	// The first statement takes the snapshot; the function runs after.
	var lsn string
	if err := tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&lsn); err != nil {
		return nil, fmt.Errorf("events: backfill: %w", err)
	}
	c := &Catchup{seen: map[int64]struct{}{}}
	if c.boundary, err = pglogrepl.ParseLSN(lsn); err != nil {
		return nil, fmt.Errorf("events: backfill: %w", err)
	}
	err = readAll(ctx, tx, schema, from, func(e Event) error {
		c.seen[e.ID] = struct{}{}
		return fn(e)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// JobState is a job's state as rebuilt from its events.
type JobState struct {
	State    queue.JobState
	Attempts int
	Queue    string
	Kind     string
}

// Mismatch is one difference between the events and the jobs table.
type Mismatch struct {
	JobID int64
	// FromEvents is nil when the job has no events; FromJobs is nil when
	// the job row is gone.
	FromEvents, FromJobs *JobState
	// Problem says what differs.
	Problem string
}

func (m Mismatch) String() string { return fmt.Sprintf("job %d: %s", m.JobID, m.Problem) }

// Rebuild replays the whole log in one snapshot and returns each job's
// state as the events say. Jobs whose log does not start with enqueued
// (older events deleted by retention) are left out, unless a retried event
// follows: a job retried after its events were pruned is rebuilt from it.
func Rebuild(ctx context.Context, pool *pgxpool.Pool, schema string) (map[int64]JobState, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("events: rebuild: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	return rebuild(ctx, tx, schema)
}

func rebuild(ctx context.Context, q querier, schema string) (map[int64]JobState, error) {
	out := map[int64]JobState{}
	truncated := map[int64]bool{}
	err := readAll(ctx, q, schema, From{}, func(e Event) error {
		s, seen := out[e.JobID]
		if e.Type == TypeRetried && (!seen || truncated[e.JobID]) {
			// A failed job's events were pruned, then it was retried: its
			// life starts again here, the attempts it took in the event.
			delete(truncated, e.JobID)
			state, _ := queue.StateAfter(e.Type)
			out[e.JobID] = JobState{State: state, Attempts: e.Attempt, Queue: e.Queue, Kind: e.Kind}
			return nil
		}
		if !seen && e.Type != TypeEnqueued {
			truncated[e.JobID] = true
		}
		if truncated[e.JobID] {
			return nil
		}
		if e.Type == TypeEnqueued && seen {
			return fmt.Errorf("events: job %d enqueued twice (event %d)", e.JobID, e.ID)
		}
		if _, known := queue.StateAfter(e.Type); !known {
			return fmt.Errorf("events: event %d has unknown type %q", e.ID, e.Type)
		}
		state, ok := queue.Next(s.State, e.Type)
		if !ok {
			return fmt.Errorf("events: event %d: %s is not a transition from %q (see queue.Transitions)", e.ID, e.Type, s.State)
		}
		s.State = state
		s.Attempts, s.Queue, s.Kind = e.Attempt, e.Queue, e.Kind
		out[e.JobID] = s
		return nil
	})
	return out, err
}

// Verify rebuilds every job's state from the events and compares it with
// the jobs table, in one snapshot. It returns the differences, by job id;
// none means the log and the table agree. Jobs with no events whose row
// finished are not differences (their events were deleted by retention).
func Verify(ctx context.Context, pool *pgxpool.Pool, schema string) ([]Mismatch, error) {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("events: verify: %w", err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	fromEvents, err := rebuild(ctx, tx, schema)
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT id, state, attempts, queue, kind, finished_at IS NOT NULL FROM `+sqlident.Quote(schema, "jobs"))
	if err != nil {
		return nil, fmt.Errorf("events: verify: %w", err)
	}
	var out []Mismatch
	fromJobs := map[int64]bool{}
	for rows.Next() {
		var id int64
		var js JobState
		var finished bool
		if err := rows.Scan(&id, &js.State, &js.Attempts, &js.Queue, &js.Kind, &finished); err != nil {
			rows.Close()
			return nil, fmt.Errorf("events: verify: %w", err)
		}
		fromJobs[id] = true
		es, ok := fromEvents[id]
		switch {
		case !ok && finished:
			// pruned by retention, or its history was truncated
		case !ok:
			out = append(out, Mismatch{JobID: id, FromJobs: &js, Problem: "unfinished job has no complete event history"})
		case es != js:
			out = append(out, Mismatch{JobID: id, FromEvents: &es, FromJobs: &js,
				Problem: fmt.Sprintf("events say %+v, jobs table says %+v", es, js)})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("events: verify: %w", err)
	}
	for id, es := range fromEvents {
		if !fromJobs[id] && (es.State == queue.StatePending || es.State == queue.StateRunning) {
			out = append(out, Mismatch{JobID: id, FromEvents: &es, Problem: "events say " + string(es.State) + " but the job row is gone"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].JobID < out[j].JobID })
	return out, nil
}
