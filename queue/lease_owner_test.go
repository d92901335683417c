package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A leased handler that outlived its lease (it ignored its context) and
// returns after the job was rescued and claimed again by the same client
// leaves the new run's lease alone: the new run keeps being extended and
// ends with its own attempt. Before, the stale run removed the new run's
// entry from the heartbeat, its lease expired while it ran, and the job
// was rescued and run again at the same time (attempts 3).
func TestStaleHandlerKeepsTheNewRunsLease(t *testing.T) {
	t.Parallel()
	releaseFirst := make(chan struct{})
	firstRunning := make(chan struct{})
	secondRunning := make(chan struct{})
	e := leasedEnv(t, "pgwake_stale_lease", 8, queue.Config{
		Queues:        map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		LeasedKinds:   []string{"k"},
		LeaseDuration: 300 * time.Millisecond,
		Backoff:       func(int) time.Duration { return time.Millisecond },
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
			switch j.Attempt {
			case 1:
				close(firstRunning)
				<-releaseFirst // ignores ctx, stuck in a call without one
				return nil
			case 2:
				close(secondRunning)
				select { // a well-behaved job of 2 s: the heartbeat keeps its lease
				case <-time.After(2 * time.Second):
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			return nil
		})},
	})
	e.run()
	ids := e.enqueueIDs(queue.NewJob{Kind: "k", MaxAttempts: 5})
	<-firstRunning
	// Another worker rescued the job after this one's lease ran out (what
	// rescueExpired writes), and this client claims it again.
	_, err := e.pool.Exec(context.Background(), `UPDATE `+e.table("jobs")+` SET state = 'pending', run_after = now(),
		leased_by = NULL, lease_expires_at = NULL, last_error = 'lease expired' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	select {
	case <-secondRunning:
	case <-time.After(10 * time.Second):
		t.Fatal("not claimed again")
	}
	close(releaseFirst) // the stale first handler returns now
	waitFor(t, 15*time.Second, "the job ended", func() bool {
		return e.count(`id = $1 AND state NOT IN ('running', 'pending')`, ids[0]) == 1
	})
	state, attempts, lastErr := e.jobRow(ids[0])
	require.Equal(t, "succeeded", state, lastErr)
	require.Equal(t, 2, attempts, "the second run kept its lease to the end")
}

// A job whose lease expired is rescued by a worker of its queue that runs
// no leased kind (the kind was taken out of LeasedKinds, or only some
// workers list it and they died): before, only clients with leased kinds
// rescued, and the job stayed running for ever.
func TestExpiredLeaseRescuedByAHeldWorker(t *testing.T) {
	t.Parallel()
	ran := make(chan int64, 4)
	e := newEnv(t, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {}},
		Backoff: func(int) time.Duration { return time.Millisecond },
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return nil
		})},
	})
	ids := e.enqueueIDs(queue.NewJob{Kind: "k"})
	// As a leased claim of a worker that then died leaves it.
	_, err := e.pool.Exec(context.Background(), `UPDATE `+e.table("jobs")+` SET state = 'running', attempts = 1,
		leased_by = 'dead-worker', lease_expires_at = now() - interval '1 second' WHERE id = $1`, ids[0])
	require.NoError(t, err)
	e.run()
	select {
	case id := <-ran:
		require.Equal(t, ids[0], id)
	case <-time.After(15 * time.Second):
		t.Fatal("the expired lease was never rescued")
	}
	waitFor(t, 10*time.Second, "succeeded", func() bool { return e.count(`id = $1 AND state = 'succeeded' AND attempts = 2`, ids[0]) == 1 })
}
