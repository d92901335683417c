package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// finishedEnv runs three jobs to success, two to failure and cancels one;
// one delayed job stays pending. It returns their ids by what became of them.
func finishedEnv(t *testing.T, cfg queue.Config) (*env, map[queue.JobState][]int64) {
	t.Helper()
	cfg.Queues = map[string]queue.QueueConfig{"default": {}}
	cfg.Handlers = map[string]queue.Handler{
		"ok":  queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
		"bad": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return errors.New("no") }),
	}
	e := newEnv(t, cfg)
	ctx := context.Background()
	ids := map[queue.JobState][]int64{}
	add := func(what queue.JobState, j queue.NewJob) {
		r, err := e.c.Enqueue(ctx, j)
		require.NoError(t, err)
		ids[what] = append(ids[what], r.ID)
	}
	for range 3 {
		add(queue.StateSucceeded, queue.NewJob{Kind: "ok"})
	}
	for range 2 {
		add(queue.StateFailed, queue.NewJob{Kind: "bad", MaxAttempts: 1})
	}
	add(queue.StateCancelled, queue.NewJob{Kind: "ok", Delay: time.Hour})
	require.NoError(t, e.c.Cancel(ctx, ids[queue.StateCancelled][0]))
	add(queue.StatePending, queue.NewJob{Kind: "ok", Delay: time.Hour})
	stop := e.run()
	waitFor(t, 30*time.Second, "jobs finished", func() bool {
		return e.count(`state IN ('succeeded', 'failed')`) == 5
	})
	stop()
	return e, ids
}

// age sets how long ago a job finished.
func (e *env) age(id int64, ago time.Duration) {
	e.t.Helper()
	_, err := e.pool.Exec(context.Background(), `UPDATE `+e.table("jobs")+` SET finished_at = now() - $2::bigint * interval '1 microsecond' WHERE id = $1 AND finished_at IS NOT NULL`, id, ago.Microseconds())
	require.NoError(e.t, err)
}

func (e *env) exists(id int64) bool {
	return e.count(`id = $1`, id) == 1
}

func TestDeleteFinishedKeepsWhatRetentionKeeps(t *testing.T) {
	t.Parallel()
	e, ids := finishedEnv(t, queue.Config{})
	ctx := context.Background()
	day := 24 * time.Hour
	s, f, c, p := ids[queue.StateSucceeded], ids[queue.StateFailed], ids[queue.StateCancelled], ids[queue.StatePending]
	e.age(s[0], 2*day)
	e.age(c[0], 2*day)
	e.age(f[0], 2*day) // failed jobs stay 7 days by default
	e.age(f[1], 8*day)
	_, err := e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET created_at = now() - interval '30 days' WHERE id = $1`, p[0])
	require.NoError(t, err)
	events := e.countSQL(`SELECT count(*) FROM ` + e.table("events"))

	n, err := e.c.DeleteFinished(ctx, queue.Retention{})
	require.NoError(t, err)
	require.Equal(t, map[queue.JobState]int64{queue.StateSucceeded: 1, queue.StateCancelled: 1, queue.StateFailed: 1}, n)
	for _, id := range []int64{s[0], c[0], f[1]} {
		require.False(t, e.exists(id), "job %d expired", id)
	}
	for _, id := range []int64{s[1], s[2], f[0], p[0]} {
		require.True(t, e.exists(id), "job %d is kept", id)
	}
	require.Equal(t, events, e.countSQL(`SELECT count(*) FROM `+e.table("events")), "events are the log's to prune")

	// Negative keeps a state for ever; other states follow their own period.
	e.age(s[1], 30*day)
	n, err = e.c.DeleteFinished(ctx, queue.Retention{Succeeded: -1, Failed: time.Hour})
	require.NoError(t, err)
	require.Equal(t, map[queue.JobState]int64{queue.StateFailed: 1}, n)
	require.True(t, e.exists(s[1]))
	require.False(t, e.exists(f[0]))
	n, err = e.c.DeleteFinished(ctx, queue.Retention{Succeeded: -1, Cancelled: -1, Failed: -1})
	require.NoError(t, err)
	require.Empty(t, n)
	require.Equal(t, 3, e.count(`true`), "two recent successes and the pending job")
}

func TestRunDeletesExpiredJobs(t *testing.T) {
	t.Parallel()
	e, ids := finishedEnv(t, queue.Config{Retention: queue.Retention{Interval: time.Second}})
	for _, id := range ids[queue.StateSucceeded] {
		e.age(id, 25*time.Hour)
	}
	e.run()
	waitFor(t, 20*time.Second, "expired jobs deleted", func() bool {
		return e.count(`state = 'succeeded'`) == 0
	})
	require.Equal(t, 4, e.count(`true`), "failed, cancelled and pending jobs are not due for deletion")
	// The counter moves after the delete has committed.
	deleted := func() float64 {
		return e.metric("pgwake_queue_jobs_deleted_total", map[string]string{"state": string(queue.StateSucceeded)})
	}
	waitFor(t, 5*time.Second, "deletions counted", func() bool { return deleted() >= 3 })
	require.Equal(t, 3.0, deleted())
}
