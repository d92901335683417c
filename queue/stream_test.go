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

// A steady stream of single-job enqueues below saturation, then silence,
// then one more job. During the stream a loop that finds jobs at
// streamRate or faster marks itself busy and looks on its own (the stream
// rule, stream.go),
// so producers may skip their NOTIFY; when the stream ends it must go idle
// through the barrier, so that the next producer notifies again. Every job
// runs and none waits for the poll (an hour). How many notifications the
// rule saves depends on timing (on a quiet machine 40-50 of 300 were
// received with the rule, 252 without; under load the two overlap), so it
// is logged, not asserted: bench/peers' latency mode at 1000 jobs/s
// measures what it buys (docs/benchmarks.md).
func TestAStreamOfJobsThenSilence(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 8}},
		PollInterval: time.Hour,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	signals := queue.EnableTestSignals(e.c)
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
	waitFor(t, 30*time.Second, "every job of the stream to run", func() bool { return ran.Load() == jobs })
	t.Logf("notifications received: %.0f for %d jobs", e.metric("pgwake_notify_notifications_total", nil), jobs)

	// Past the 20 ms linger the loop goes idle again, through the barrier,
	// and the next job must wake it (the poll is an hour away).
	signals.WaitAsleep(t, "default", jobs)
	_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the job after the stream to run", func() bool { return ran.Load() == jobs+1 })
	require.Zero(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
}
