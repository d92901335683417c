package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// A failed job whose events were pruned, then retried, is rebuilt from its
// retried event: Verify still holds (docs/events.md, "Verify").
func TestRetryAfterPruneVerifyHolds(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t, nil)
	schema := pgtest.SchemaOn(t, pool)
	_, err := migrations.Up(ctx, pool, schema)
	require.NoError(t, err)
	jobs, evs := sqlident.Quote(schema, "jobs"), sqlident.Quote(schema, "events")
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+sqlident.Quote(schema, "enqueue")+`('k', max_attempts => 1)`).Scan(&id))
	// The job ran once and failed three days ago.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET state = 'failed', attempts = 1, finished_at = now() - interval '3 days' WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+evs+` (job_id, type, queue, kind, attempt) VALUES ($1, 'started', 'default', 'k', 1), ($1, 'failed', 'default', 'k', 1)`, id)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+evs+` SET at = at - interval '3 days' WHERE job_id = $1`, id)
	require.NoError(t, err)
	mismatches, err := events.Verify(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)

	n, err := events.DeleteBefore(ctx, pool, schema, time.Now().Add(-24*time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "the finished job's events pruned")
	var ok bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+sqlident.Quote(schema, "retry")+`($1)`, id).Scan(&ok))
	require.True(t, ok)
	mismatches, err = events.Verify(ctx, pool, schema)
	require.NoError(t, err)
	require.Empty(t, mismatches, "a retried job whose old events were pruned")
	states, err := events.Rebuild(ctx, pool, schema)
	require.NoError(t, err)
	require.Equal(t, events.JobState{State: "pending", Attempts: 1, Queue: "default", Kind: "k"}, states[id])
}

// An enqueued event whose run_after Go cannot hold (year 20000, written by
// the SQL API before migration 0023 refused it) is still streamed, and
// Verify and Rebuild read the log.
func TestEventWithAFarRunAfterIsStreamedAndReplayed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ps, live := channelSink(t)
	t.Cleanup(func() { _ = ps.Close() })
	_, stop := e.RunStream(e.Config(ps))
	defer stop()
	var far int64
	tx, err := e.Pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, `INSERT INTO `+e.Table("jobs")+` (queue, kind, run_after) VALUES ('default', 'k', '20000-01-01 00:00:00+00') RETURNING id`).Scan(&far))
	_, err = tx.Exec(ctx, `INSERT INTO `+e.Table("events")+` (job_id, type, queue, kind, attempt, data)
		VALUES ($1, 'enqueued', 'default', 'k', 0, jsonb_build_object('run_after', '20000-01-01 00:00:00+00'::timestamptz))`, far)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	var last int64
	require.NoError(t, e.Pool.QueryRow(ctx, `SELECT `+e.Table("enqueue")+`('k')`).Scan(&last))
	got := map[int64]bool{}
	waitFor(t, 30*time.Second, "the last job's enqueued event", func() bool {
		for _, r := range live.Snapshot() {
			got[r.Ev.JobID] = true
		}
		return got[last]
	})
	require.True(t, got[far], "the enqueued event of the job due in year 20000 was published")
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
	_, err = events.Rebuild(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
}
