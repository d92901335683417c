package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/sqlident"
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
	jobs, evs := sqlident.Quote(p.schema, "jobs"), sqlident.Quote(p.schema, "events")
	for _, q := range []struct {
		sql string
		n   int
	}{
		{`INSERT INTO ` + evs + ` (job_id, type, queue, kind, attempt, at)
			SELECT -g, 'succeeded', 'bench', 'bench', 1, now() - interval '30 days' FROM generate_series(1, $1::int) g`, expired},
		{`INSERT INTO ` + jobs + ` (queue, kind, state, attempts, finished_at)
			SELECT 'bench', 'bench', 'succeeded', 1, now() - interval '2 days' - g * interval '1 millisecond' FROM generate_series(1, $1::int) g`, expired},
		{`WITH j AS (
			INSERT INTO ` + jobs + ` (queue, kind, state, attempts, last_error, finished_at)
			SELECT 'bench', 'bench', 'failed', 1, 'boom', now() - interval '2 days' - (g % 345600) * interval '1 second'
			FROM generate_series(1, $1::int) g
			RETURNING id, finished_at)
		INSERT INTO ` + evs + ` (job_id, type, queue, kind, attempt, at, data)
		SELECT id, 'failed', 'bench', 'bench', 1, finished_at, '{"error": "boom"}' FROM j`, kept},
	} {
		if _, err := p.env.Pool.Exec(ctx, q.sql, q.n); err != nil {
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
	for _, t := range []string{"jobs", "events"} {
		if _, err := p.env.Pool.Exec(ctx, `VACUUM ANALYZE `+sqlident.Quote(p.schema, t)); err != nil {
			return err
		}
	}
	checkpoint(ctx, p.env.Pool)
	return nil
}

// EnqueueSpread enqueues n jobs with one EnqueueMany, job i in queue
// "q<i>", and counts the jobs table.
func (p *Pgwake) EnqueueSpread(ctx context.Context, n int) (int64, error) {
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: fmt.Sprintf("q%d", i+1), Kind: BenchKind, Payload: json.RawMessage(EncodePayload(Job{Seq: int64(i)}))}
	}
	if _, err := p.client.EnqueueMany(ctx, jobs); err != nil {
		return 0, err
	}
	var got int64
	err := p.env.Pool.QueryRow(ctx, `SELECT count(*) FROM `+sqlident.Quote(p.schema, "jobs")).Scan(&got)
	return got, err
}
