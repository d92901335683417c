package queue_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// TestEnqueueOfOneJobCallsEnqueueOne: Enqueue of one job without a unique
// key goes through the SQL API's scalar enqueue_one (migration 0021), with
// every field it sets written as enqueue_jobs writes it; a job with a unique
// key, and more jobs in one call, still go through enqueue_jobs.
func TestEnqueueOfOneJobCallsEnqueueOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(
		func(context.Context, pgx.Tx, *queue.Job) error { return nil })}})
	ctx := context.Background()
	calls := func(tx pgx.Tx, fn string) int64 {
		var n *int64
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_stat_get_xact_function_calls(p.oid)
			FROM pg_proc p WHERE p.proname = $1 AND p.pronamespace = $2::regnamespace`, fn, e.schema).Scan(&n))
		if n == nil {
			return 0
		}
		return *n
	}
	enqueue := func(jobs ...queue.NewJob) (one, many int64, ids []int64) {
		tx, err := e.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, `SET LOCAL track_functions = 'all'`)
		require.NoError(t, err)
		// The counts are the session's since it last reported them: take
		// the difference inside one transaction.
		one0, many0 := calls(tx, "enqueue_one"), calls(tx, "enqueue_jobs")
		res, err := e.c.EnqueueManyTx(ctx, tx, jobs)
		require.NoError(t, err)
		for _, r := range res {
			ids = append(ids, r.ID)
		}
		one, many = calls(tx, "enqueue_one")-one0, calls(tx, "enqueue_jobs")-many0
		require.NoError(t, tx.Commit(ctx))
		return one, many, ids
	}

	runAt := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	one, many, ids := enqueue(queue.NewJob{Kind: "k", Queue: "q1", Payload: json.RawMessage(`{"a": [1, 2]}`),
		Priority: -3, MaxAttempts: 7, RunAfter: runAt, Metadata: map[string]string{"m": "v"}})
	require.Equal(t, [2]int64{1, 0}, [2]int64{one, many}, "one job without a unique key: enqueue_one, not enqueue_jobs")
	var (
		queueName, kind, payload, meta, state string
		prio, maxAtt, attempts                int
		runAfter                              time.Time
	)
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT queue, kind, payload::text, coalesce(metadata::text, ''), state,
		priority, max_attempts, attempts, run_after FROM `+e.table("jobs")+` WHERE id = $1`, ids[0]).Scan(
		&queueName, &kind, &payload, &meta, &state, &prio, &maxAtt, &attempts, &runAfter))
	require.Equal(t, []any{"q1", "k", `{"a": [1, 2]}`, `{"m": "v"}`, "pending", -3, 7, 0},
		[]any{queueName, kind, payload, meta, state, prio, maxAtt, attempts})
	require.True(t, runAfter.Equal(runAt), "run_after %s, want %s", runAfter, runAt)
	require.Equal(t, []queue.EventType{queue.EventEnqueued}, e.eventTypes(ids[0]))

	// A delay is counted from the transaction's start, as enqueue_jobs does.
	_, _, ids = enqueue(queue.NewJob{Kind: "k", Delay: 10 * time.Second})
	require.Equal(t, 1, e.count(`id = $1 AND run_after > now() + interval '9 seconds' AND queue = 'default'`, ids[0]))

	one, many, _ = enqueue(queue.NewJob{Kind: "k", UniqueKey: "u"})
	require.Equal(t, [2]int64{0, 1}, [2]int64{one, many}, "a unique key: enqueue_jobs")
	one, many, _ = enqueue(queue.NewJob{Kind: "k"}, queue.NewJob{Kind: "k"})
	require.Equal(t, [2]int64{0, 1}, [2]int64{one, many}, "two jobs: enqueue_jobs")
}
