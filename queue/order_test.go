package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// One worker runs a queue's due jobs in claim order even when batches are
// cut short (cutAfter) and their unstarted jobs are put back: the next
// claim starts at the head again instead of after the cut batch's last job.
// (The Watermill subscriber's publish order rests on this.)
func TestCutBatchesKeepClaimOrder(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var ran []int64
	e := newEnv(t, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		MaxBatch: 32,
		Handlers: map[string]queue.Handler{"ok": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			mu.Lock()
			ran = append(ran, j.ID)
			mu.Unlock()
			if j.ID%5 == 0 {
				time.Sleep(3 * time.Millisecond) // past cutAfter (2 x BatchTarget) within a batch or two
			}
			return nil
		})},
	})
	const n = 300
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "ok"}
	}
	res, err := e.c.EnqueueMany(context.Background(), jobs)
	require.NoError(t, err)
	e.run()
	waitFor(t, time.Minute, "all succeeded", func() bool { return e.count("state = 'succeeded'") == n })
	mu.Lock()
	defer mu.Unlock()
	want := make([]int64, n)
	for i, r := range res {
		want[i] = r.ID
	}
	require.Equal(t, want, ran)
	require.Greater(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "busy"}), 0.0, "batches were claimed under a backlog")
}
