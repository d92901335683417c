package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Retention says how long finished jobs stay in the jobs table after they
// finish (finished_at), in every queue of the schema (not only the queues the
// client works). Zero fields take the defaults; a negative field keeps jobs
// of that state for ever; clients with different settings on one schema each
// delete by their own. Deleting a job does not delete its events:
// the log is pruned on its own schedule (events.DeleteBefore, `pgwake events
// prune`), and events.Verify accepts finished jobs whose row is gone.
type Retention struct {
	// Succeeded jobs are deleted this long after they finish. Default 24h.
	Succeeded time.Duration
	// Cancelled jobs are deleted this long after they were cancelled.
	// Default 24h.
	Cancelled time.Duration
	// Failed jobs (attempts exhausted) are deleted this long after their last
	// attempt. Default 7 days, so there is time to look and retry.
	Failed time.Duration
	// Interval is how often Run deletes what has expired. Default 1m.
	Interval time.Duration
}

// Default retention periods, as River's job cleaner has them.
const (
	DefaultRetainSucceeded = 24 * time.Hour
	DefaultRetainCancelled = 24 * time.Hour
	DefaultRetainFailed    = 7 * 24 * time.Hour
)

// deleteBatch is how many jobs one DELETE statement removes at most: short
// statements, so retention never holds many row locks or a long snapshot.
const deleteBatch = 1000

func (r Retention) withDefaults() Retention {
	if r.Succeeded == 0 {
		r.Succeeded = DefaultRetainSucceeded
	}
	if r.Cancelled == 0 {
		r.Cancelled = DefaultRetainCancelled
	}
	if r.Failed == 0 {
		r.Failed = DefaultRetainFailed
	}
	if r.Interval == 0 {
		r.Interval = time.Minute
	}
	return r
}

func (r Retention) validate() error {
	if r.Interval < time.Second {
		return fmt.Errorf("%w: Retention.Interval %s is below 1s", ErrInvalidConfig, r.Interval)
	}
	return nil
}

// keepsAll reports whether nothing is ever deleted.
func (r Retention) keepsAll() bool { return r.Succeeded < 0 && r.Cancelled < 0 && r.Failed < 0 }

// DeleteFinished deletes the finished jobs that r says have expired, in
// short batches, and returns how many it deleted by state. Zero fields of r
// take the defaults and negative ones keep that state for ever, as in
// Config.Retention. Pending jobs are never deleted. Run calls this every
// Retention.Interval; call it yourself from a client that does not Run, or
// use `pgwake jobs prune`.
//
// It deletes one state at a time, oldest first, each with its own cutoff:
// a batch reads the jobs it deletes, not those kept. A batch cancelled by
// the server (a role's statement_timeout, SQLSTATE 57014) is retried at
// half its size, down to one job, so retention still makes progress on a
// slow or busy server; the size grows back after each full batch.
func (c *Client) DeleteFinished(ctx context.Context, r Retention) (map[JobState]int64, error) {
	r = r.withDefaults()
	out := map[JobState]int64{}
	for _, st := range []struct {
		state JobState
		keep  time.Duration
	}{{StateSucceeded, r.Succeeded}, {StateCancelled, r.Cancelled}, {StateFailed, r.Failed}} {
		if st.keep < 0 {
			continue
		}
		n, err := c.deleteExpired(ctx, st.state, st.keep)
		if n > 0 {
			out[st.state] = n
		}
		if err != nil {
			return out, fmt.Errorf("queue: delete finished %s jobs: %w", st.state, err)
		}
	}
	// Unique keys held for a period that has passed (docs/unique.md): the
	// next enqueue would take them over anyway; this keeps the table small.
	if _, err := c.inBatches(ctx, c.sql.deleteUniquePeriods); err != nil {
		return out, fmt.Errorf("queue: delete expired unique periods: %w", err)
	}
	return out, nil
}

// sqlstateQueryCanceled is a statement the server cancelled: its
// statement_timeout, or pg_cancel_backend.
const sqlstateQueryCanceled = "57014"

// deleteExpired deletes the jobs of state that finished more than keep ago,
// in batches of at most deleteBatch, halving a batch the server cancelled.
func (c *Client) deleteExpired(ctx context.Context, state JobState, keep time.Duration) (int64, error) {
	return c.inBatches(ctx, c.sql.deleteFinished, state, float64(keep.Microseconds()))
}

// inBatches runs the delete stmt (args, then the batch size) until a batch
// deletes fewer rows than its size, halving a batch the server cancelled.
func (c *Client) inBatches(ctx context.Context, stmt string, args ...any) (int64, error) {
	var total int64
	size := deleteBatch
	for {
		tag, err := c.pool.Exec(ctx, stmt, append(args, size)...)
		if err != nil {
			var pe *pgconn.PgError
			if ctx.Err() == nil && size > 1 && errors.As(err, &pe) && pe.Code == sqlstateQueryCanceled {
				size /= 2
				continue
			}
			return total, err
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(size) {
			return total, nil
		}
		size = min(size*2, deleteBatch)
	}
}

// cleaner runs DeleteFinished every Retention.Interval until ctx ends.
// Several processes may run it at once: SKIP LOCKED keeps them apart.
func (c *Client) cleaner(ctx context.Context) {
	r := c.cfg.Retention
	if r.keepsAll() {
		return
	}
	every(ctx, r.Interval, func() {
		n, err := c.DeleteFinished(ctx, r)
		for state, k := range n {
			c.metrics.deleted.WithLabelValues(string(state)).Add(float64(k))
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn("deleting finished jobs failed", zap.Error(err))
		} else if total := n[StateSucceeded] + n[StateCancelled] + n[StateFailed]; total > 0 {
			c.log.Debug("deleted finished jobs", zap.Int64("jobs", total))
		}
	})
}
