package queue_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A steady stream of single-job enqueues below saturation: without the
// stream rule, the loop is woken by each job's NOTIFY and sleeps again at
// once, so its idle mark stays up and most producers notify (252 of 300
// notifications received, measured without the rule). With it, the loop
// marks itself busy once jobs keep arriving and finds them on its own, so
// producers stop notifying and skip the NOTIFY's commit-time lock (47 of
// 300 measured); every job still runs, none by the poll.
func TestAStreamOfJobsStopsTheNotifications(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 8}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	e.run()
	ctx := context.Background()
	const jobs = 300
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for range jobs {
		_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
		require.NoError(t, err)
		<-tick.C
	}
	waitFor(t, 30*time.Second, "every job to run", func() bool { return ran.Load() == jobs })
	require.Zero(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
	notified := e.metric("pgwake_notify_notifications_total", nil)
	t.Logf("notifications received: %.0f for %d jobs", notified, jobs)
	require.Less(t, notified, float64(jobs)/2, "producers kept notifying a loop that jobs kept waking")
}
