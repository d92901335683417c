package events

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// Pruning walks the log in id order: one statement reads its window of
// events and probes their jobs, however long the log is (300,000 events).
// The old statement sorted every old event by time and hashed all of jobs
// for each batch: quadratic in the log. DeleteBefore still deletes exactly
// the old events of finished or deleted jobs.
func TestDeleteBeforeIsFlatInTheLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	jobs, events := sqlident.Quote(schema, "jobs"), sqlident.Quote(schema, "events")
	// Jobs 1-1000 finished 30 days ago (1-500 since deleted by retention);
	// job 5000 is still pending, scheduled ahead.
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, state, finished_at)
		SELECT i, 'q', 'k', 'succeeded', now() - interval '30 days' FROM generate_series(501, 1000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, run_after) VALUES (5000, 'q', 'k', now() + interval '1 year')`)
	require.NoError(t, err)
	// 200,000 old events (one in 1,000 of job 5000), then 100,000 new.
	_, err = pool.Exec(ctx, `INSERT INTO `+events+` (job_id, type, queue, kind, attempt, at)
		SELECT CASE WHEN i % 1000 = 0 THEN 5000 ELSE i % 1000 END, 'enqueued', 'q', 'k', 0,
			CASE WHEN i <= 200000 THEN now() - interval '30 days' + i * interval '1 millisecond' ELSE now() END
		FROM generate_series(1, 300000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+jobs+`; ANALYZE `+events)
	require.NoError(t, err)
	cutoff := time.Now().Add(-24 * time.Hour)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var out []byte
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+deleteBeforeSQL(events, jobs, sqlident.Quote(schema, "events_pruned")),
		cutoff, int64(150000), 100).Scan(&out))
	var plans []struct {
		Plan struct {
			Hit  int64 `json:"Shared Hit Blocks"`
			Read int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &plans))
	buffers := plans[0].Plan.Hit + plans[0].Plan.Read
	t.Logf("one window of 100 events: %d buffers", buffers)
	require.LessOrEqual(t, buffers, int64(1500), "about 7 per event; the statement ordered by time read 3,602")
	require.NoError(t, tx.Rollback(ctx))

	n, err := DeleteBefore(ctx, pool, schema, cutoff, 7000)
	require.NoError(t, err)
	require.Equal(t, int64(200000-200), n)
	var kept, pending int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE job_id = 5000) FROM `+events).Scan(&kept, &pending))
	require.Equal(t, 100000+200, kept)
	require.Equal(t, 100+200, pending, "the pending job keeps its history")
}

// Under a role's statement_timeout of 50 ms, a prune whose windows take
// longer is retried at half the size and deletes everything: it returned
// the first cancel (57014) and deleted nothing, at every run.
func TestDeleteBeforeUnderAStatementTimeout(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	jobs, evs := sqlident.Quote(schema, "jobs"), sqlident.Quote(schema, "events")
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (id, queue, kind, state, finished_at)
		SELECT i, 'q', 'k', 'succeeded', now() - interval '30 days' FROM generate_series(1, 1000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+evs+` (job_id, type, queue, kind, attempt, at)
		SELECT i % 2000, 'enqueued', 'q', 'k', 0, now() - interval '30 days' + i * interval '1 millisecond'
		FROM generate_series(1, 200000) i`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+jobs+`; ANALYZE `+evs)
	require.NoError(t, err)
	slow := pgtest.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["statement_timeout"] = "50ms" })
	n, err := DeleteBefore(ctx, slow, schema, time.Now().Add(-24*time.Hour), 0)
	require.NoError(t, err)
	require.EqualValues(t, 200000, n)
	var left int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+evs).Scan(&left))
	require.Zero(t, left)
}
