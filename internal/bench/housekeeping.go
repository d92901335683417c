package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/queue"
)

// housekeepingBatch is the event pruning window of the housekeeping mode,
// the size of a retention batch.
const housekeepingBatch = 1000

// Housekeep fills the schema with kept failed jobs (finished 2 to 6 days
// ago: inside the 7-day retention of failed jobs, past the 24 h of
// succeeded ones) and one recent event each, behind expired succeeded
// jobs (finished 2 days ago) and expired events of deleted jobs (30 days
// old). It then times DeleteFinished with default retention on a pool
// whose statement_timeout is 50 ms, and events.DeleteBefore with a cutoff of
// 14 days and windows of 1,000 events.
func (p *Pgwake) Housekeep(ctx context.Context, kept, expired int) (Housekeeping, error) {
	var h Housekeeping
	now := time.Now()
	for _, seed := range []queue.FinishedSeed{
		// events of deleted jobs, 30 days old
		{Count: expired, State: queue.StateSucceeded, FinishedAt: now.Add(-30 * 24 * time.Hour), EventsOnly: true},
		// expired succeeded jobs, without events
		{Count: expired, State: queue.StateSucceeded, FinishedAt: now.Add(-48 * time.Hour), Spacing: time.Millisecond},
		// kept failed jobs, one failed event each
		{Count: kept, State: queue.StateFailed, FinishedAt: now.Add(-48 * time.Hour), Spacing: time.Second, Cycle: 345600,
			LastError: "boom", Events: queue.SeedFinalEvent},
	} {
		seed.Queue, seed.Kind = BenchQueue, BenchKind
		if _, err := p.client.SeedFinished(ctx, seed); err != nil {
			return h, fmt.Errorf("fill tables: %w", err)
		}
	}
	if err := p.Settle(ctx); err != nil {
		return h, err
	}

	cfg := p.env.Pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "50ms"
	cfg.MaxConns = 2
	slow, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return h, err
	}
	defer slow.Close()
	c, err := queue.New(slow, queue.Config{Schema: p.schema})
	if err != nil {
		return h, err
	}
	t := time.Now()
	n, err := c.DeleteFinished(ctx, queue.Retention{})
	h.Retention = time.Since(t)
	if err != nil {
		return h, fmt.Errorf("retention under statement_timeout 50ms: %w", err)
	}
	h.JobsDeleted = n[queue.StateSucceeded] + n[queue.StateCancelled] + n[queue.StateFailed]
	// Full batches of succeeded jobs, the short last one, one empty look
	// each at cancelled and failed jobs.
	h.RetentionBatches = expired/1000 + 1 + 2

	t = time.Now()
	h.EventsDeleted, err = events.DeleteBefore(ctx, p.env.Pool, p.schema, time.Now().Add(-14*24*time.Hour), housekeepingBatch)
	h.Prune = time.Since(t)
	if err != nil {
		return h, err
	}
	h.PruneBatches = expired/housekeepingBatch + 1
	return h, nil
}

// Settle vacuums and analyzes the jobs and events tables, so that no
// autovacuum of a bulk insert runs during the measurement after it.
func (p *Pgwake) Settle(ctx context.Context) error {
	if err := p.client.VacuumAnalyze(ctx); err != nil {
		return err
	}
	checkpoint(ctx, p.env.Pool)
	return nil
}

// EnqueueSpread enqueues n jobs with one EnqueueMany, job i in queue
// "q<i>", and counts the pending jobs of the schema (QueueStats, exact).
func (p *Pgwake) EnqueueSpread(ctx context.Context, n int) (int64, error) {
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: fmt.Sprintf("q%d", i+1), Kind: BenchKind, Payload: json.RawMessage(EncodePayload(Job{Seq: int64(i)}))}
	}
	if _, err := p.client.EnqueueMany(ctx, jobs); err != nil {
		return 0, err
	}
	st, err := p.client.QueueStats(ctx, queue.QueueStatsParams{ExactLimit: -1})
	var got int64
	for _, q := range st {
		got += q.Pending + q.Scheduled
	}
	return got, err
}
