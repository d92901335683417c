package queue_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
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

// Leased handlers that hold every pool connection (a pool of 2 with
// AllowSmallPool, six handlers that write first and then wait on something
// slow) do not starve the lease heartbeat, which has a connection of its
// own: no lease of the healthy process expires, and no job runs twice at
// once while a second client works the same queue. Before, every lease
// expired, the second client rescued all six jobs and ran them again
// beside the first.
func TestLeaseHeartbeatNotStarvedByThePool(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	active := map[int64]int{}
	var overlaps atomic.Int32
	h := queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
		mu.Lock()
		active[j.ID]++
		if active[j.ID] > 1 {
			overlaps.Add(1)
		}
		mu.Unlock()
		defer func() { mu.Lock(); active[j.ID]--; mu.Unlock() }()
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // holds a pool connection from here on
			return err
		}
		select {
		case <-time.After(2 * time.Second):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	cfg := queue.Config{
		Queues:         map[string]queue.QueueConfig{"default": {MaxWorkers: 6}},
		LeasedKinds:    []string{"k"},
		LeaseDuration:  500 * time.Millisecond,
		Backoff:        func(int) time.Duration { return time.Millisecond },
		AllowSmallPool: true,
		Handlers:       map[string]queue.Handler{"k": h},
	}
	a := leasedEnv(t, "pgwake_lease_starved_a", 2, cfg)
	ids := a.enqueueIDs(queue.NewJob{Kind: "k"}, queue.NewJob{Kind: "k"}, queue.NewJob{Kind: "k"},
		queue.NewJob{Kind: "k"}, queue.NewJob{Kind: "k"}, queue.NewJob{Kind: "k"})
	a.run()
	observer := pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	count := func(where string) int {
		var n int
		require.NoError(t, observer.QueryRow(context.Background(), `SELECT count(*) FROM `+a.table("jobs")+` WHERE `+where).Scan(&n))
		return n
	}
	waitFor(t, 10*time.Second, "two running in the first client", func() bool { return count(`state = 'running'`) >= 2 })
	b := newEnvOn(t, pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 20 }), a.schema, cfg)
	b.run()
	waitFor(t, 60*time.Second, "all done", func() bool { return count(`state = 'succeeded'`) == len(ids) })
	var rescued int
	require.NoError(t, observer.QueryRow(context.Background(), `SELECT count(*) FROM `+a.table("events")+` WHERE type = 'retry_scheduled'`).Scan(&rescued))
	require.Zero(t, rescued, "no lease of the healthy client expired")
	require.Zero(t, overlaps.Load(), "no job ran twice at once")
}
