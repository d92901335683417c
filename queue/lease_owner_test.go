package queue_test

import (
	"context"
	"fmt"
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

// NOTIFY needs no privilege, so any role that can connect can send the
// control payloads workers listen for. They are hints now: a stop of a
// held job is obeyed only when a session waits for the job's row (Cancel's
// UPDATE), a leased job's cancel only when its row is no longer running
// under the worker's lease, and pause and resume make the worker read the
// paused queues. Before, a stray '!stop|<id>' ended a running job
// cancelled, '!cancel|<id>' cost a leased job an attempt (its handler ran
// twice), and '!resume|<queue>' ran a paused queue's jobs.
func TestSpoofedControlsAreIgnored(t *testing.T) {
	t.Parallel()
	slow := queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *queue.Job) error {
		select {
		case <-time.After(1500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	e := leasedEnv(t, "pgwake_spoofed_controls", 30, queue.Config{
		Queues:      map[string]queue.QueueConfig{"default": {}, "paused": {}},
		LeasedKinds: []string{"leased"},
		Handlers:    map[string]queue.Handler{"held": slow, "leased": slow, "k": slow},
	})
	ctx := context.Background()
	require.NoError(t, e.c.PauseQueue(ctx, "paused"))
	e.run()
	spoof := func(payload string) {
		_, err := e.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, queue.WakeChannel(e.schema), payload)
		require.NoError(t, err)
	}
	ids := e.enqueueIDs(queue.NewJob{Kind: "held"}, queue.NewJob{Kind: "leased"})
	waitFor(t, 10*time.Second, "the leased job runs", func() bool { return e.count(`id = $1 AND state = 'running'`, ids[1]) == 1 })
	time.Sleep(200 * time.Millisecond) // and the held one's handler, which has no running state to wait for
	spoof(fmt.Sprintf("!stop|%d", ids[0]))
	spoof(fmt.Sprintf("!cancel|%d", ids[1]))
	paused := e.enqueueIDs(queue.NewJob{Kind: "k", Queue: "paused"})
	spoof("!resume|paused")
	waitFor(t, 15*time.Second, "both ran to the end", func() bool {
		return e.count(`id = ANY($1) AND state = 'succeeded' AND attempts = 1`, ids) == 2
	})
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending'`, paused[0]), "the paused queue still waits")

	// The real controls still work: Cancel stops a running held job, and
	// a resume runs the paused queue.
	more := e.enqueueIDs(queue.NewJob{Kind: "held"})
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, e.c.Cancel(ctx, more[0]))
	require.Equal(t, 1, e.count(`id = $1 AND state = 'cancelled'`, more[0]))
	require.NoError(t, e.c.ResumeQueue(ctx, "paused"))
	waitFor(t, 10*time.Second, "the resumed queue ran", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, paused[0]) == 1 })
}
