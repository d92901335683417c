package queue

import (
	"context"
	"fmt"
	"time"

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

// deleteBatch is how many jobs one DELETE statement removes: short
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

// micros is a retention period as the statement takes it: NULL keeps all.
func micros(d time.Duration) *float64 {
	if d < 0 {
		return nil
	}
	us := float64(d.Microseconds())
	return &us
}

// DeleteFinished deletes the finished jobs that r says have expired, in
// short batches, and returns how many it deleted by state. Zero fields of r
// take the defaults and negative ones keep that state for ever, as in
// Config.Retention. Pending jobs are never deleted. Run calls this every
// Retention.Interval; call it yourself from a client that does not Run, or
// use `pgwake jobs prune`.
func (c *Client) DeleteFinished(ctx context.Context, r Retention) (map[string]int64, error) {
	r = r.withDefaults()
	out := map[string]int64{}
	if r.keepsAll() {
		return out, nil
	}
	for {
		rows, err := c.pool.Query(ctx, c.sql.deleteFinished, micros(r.Succeeded), micros(r.Cancelled), micros(r.Failed), deleteBatch)
		if err != nil {
			return out, fmt.Errorf("queue: delete finished jobs: %w", err)
		}
		n := 0
		for rows.Next() {
			var state string
			if err := rows.Scan(&state); err != nil {
				rows.Close()
				return out, fmt.Errorf("queue: delete finished jobs: %w", err)
			}
			out[state]++
			n++
		}
		if err := rows.Err(); err != nil {
			return out, fmt.Errorf("queue: delete finished jobs: %w", err)
		}
		if n < deleteBatch {
			return out, nil
		}
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
			c.metrics.deleted.WithLabelValues(state).Add(float64(k))
		}
		if err != nil && ctx.Err() == nil {
			c.log.Warn("deleting finished jobs failed", zap.Error(err))
		} else if total := n[StateSucceeded] + n[StateCancelled] + n[StateFailed]; total > 0 {
			c.log.Debug("deleted finished jobs", zap.Int64("jobs", total))
		}
	})
}
