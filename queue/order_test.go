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

// With one worker, the next claim does not wait for the commit of a batch
// whose jobs all ran and succeeded: it starts after them in claim order
// (their rows stay locked until the commit lands), so a backlog's claim
// round trip overlaps the previous batch's commit. Here the first job's
// commit is held (its Complete hook) until a later job's handler has run.
func TestNextClaimOverlapsTheCommit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var ran []int64
	later := make(chan struct{})
	var first int64
	var once sync.Once
	overlapped := make(chan bool, 1)
	e := newEnv(t, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		MaxBatch: 4,
		Handlers: map[string]queue.Handler{"ok": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			mu.Lock()
			ran = append(ran, j.ID)
			mu.Unlock()
			if j.ID != first {
				once.Do(func() { close(later) })
			}
			return nil
		})},
		Hooks: queue.Hooks{Complete: func(_ context.Context, j *queue.Job) func(queue.JobState, error) {
			if j.ID == first {
				select {
				case <-later:
					overlapped <- true
				case <-time.After(30 * time.Second): // a guard, not a timing: without the overlap nothing else runs
					overlapped <- false
				}
			}
			return nil
		}},
	})
	const n = 9
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "ok"}
	}
	res, err := e.c.EnqueueMany(context.Background(), jobs)
	require.NoError(t, err)
	first = res[0].ID
	e.run()
	require.True(t, <-overlapped, "a later job ran while the first job's commit was held")
	waitFor(t, time.Minute, "all succeeded", func() bool { return e.count("state = 'succeeded'") == n })
	mu.Lock()
	defer mu.Unlock()
	want := make([]int64, n)
	for i, r := range res {
		want[i] = r.ID
	}
	require.Equal(t, want, ran)
}
