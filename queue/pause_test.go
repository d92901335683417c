package queue_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// dbNow is the database's clock, which the effects table is stamped with.
func (e *env) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	require.NoError(e.t, e.pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

// workerOn builds a client on e's schema that works queue q, recording an
// effect per job.
func workerOn(t *testing.T, e *env, q string, poll time.Duration) *env {
	var w *env
	w = newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues:       map[string]queue.QueueConfig{q: {MaxWorkers: 2}},
		PollInterval: poll,
		Handlers: map[string]queue.Handler{"work": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return effect(ctx, tx, w.schema, j)
		})},
	})
	return w
}

// A pause made through one client stops claims in another within 1 s (by
// notification: its poll is a minute), enqueues still go in, and a resume
// restarts claims before the poll could have (within 10 s). The times are
// logged, not asserted closer: a loaded machine must not fail a test;
// BenchmarkPauseResume measures them (docs/pause.md).
func TestPauseStopsClaimsInOtherClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newEnv(t, queue.Config{})
	w := workerOn(t, admin, "pq", time.Minute)
	signals := queue.EnableTestSignals(w.c)
	w.run()

	// A steady stream of jobs, one every 5 ms.
	streamCtx, stopStream := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for streamCtx.Err() == nil {
			if _, err := admin.c.Enqueue(streamCtx, queue.NewJob{Queue: "pq", Kind: "work"}); err != nil && streamCtx.Err() == nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	defer func() { stopStream(); wg.Wait() }()
	lastEffect := func(after time.Time) (time.Time, bool) {
		var at *time.Time
		require.NoError(t, w.pool.QueryRow(ctx, `SELECT max(at) FROM `+w.table("effects")+` WHERE at > $1`, after).Scan(&at))
		if at == nil {
			return time.Time{}, false
		}
		return *at, true
	}
	firstEffect := func(after time.Time) (time.Time, bool) {
		var at *time.Time
		require.NoError(t, w.pool.QueryRow(ctx, `SELECT min(at) FROM `+w.table("effects")+` WHERE at > $1`, after).Scan(&at))
		if at == nil {
			return time.Time{}, false
		}
		return *at, true
	}

	var stops, resumes []time.Duration
	for round := range 5 {
		waitFor(t, 10*time.Second, "the worker claiming", func() bool { _, ok := firstEffect(admin.dbNow().Add(-50 * time.Millisecond)); return ok })
		signals.ForgetPausedLooks()
		require.NoError(t, admin.c.PauseQueue(ctx, "pq"))
		paused := admin.dbNow()
		pendingAtPause := admin.count(`queue = 'pq' AND state = 'pending'`)
		// The worker met the pause (it claims nothing more), and the
		// claims it made before have ended.
		signals.WaitPausedLooks(t, "pq", 1)
		waitFor(t, 5*time.Second, "claims in flight to end", func() bool {
			return admin.countSQL(`SELECT count(*) FROM `+admin.table("attempts")) == 0
		})
		stop := time.Duration(0)
		if at, ok := lastEffect(paused); ok {
			stop = at.Sub(paused)
		}
		stops = append(stops, stop)
		waitFor(t, 5*time.Second, fmt.Sprintf("round %d: enqueues go in while paused", round), func() bool {
			return admin.count(`queue = 'pq' AND state = 'pending'`) > pendingAtPause
		})
		require.Less(t, stop, time.Second, "round %d: claims went on %s after the pause", round, stop)

		require.NoError(t, admin.c.ResumeQueue(ctx, "pq"))
		resumed := admin.dbNow()
		var first time.Time
		// Within 10 s: by the notification, not the one-minute poll.
		waitFor(t, 10*time.Second, "a claim after the resume", func() bool {
			at, ok := firstEffect(resumed)
			first = at
			return ok
		})
		resumes = append(resumes, first.Sub(resumed))
	}
	sort.Slice(stops, func(i, j int) bool { return stops[i] < stops[j] })
	sort.Slice(resumes, func(i, j int) bool { return resumes[i] < resumes[j] })
	t.Logf("pause: last claim after PauseQueue returned: %v (max %s); first claim after ResumeQueue returned: %v (max %s)",
		stops, stops[len(stops)-1], resumes, resumes[len(resumes)-1])
}

// pausedHold is how long TestPausedQueueClaimsNothingWhileEnqueued keeps
// its queue paused while jobs are enqueued (the 5 s).
const pausedHold = 5 * time.Second

// Once a worker knows its queue is paused (its gauge) and its claims in
// flight have ended, it claims none of the jobs enqueued over the next 5 s
// (by the database's clock), however many arrive, across its pause polls
// (5 s apart); a resume lets it claim them.
func TestPausedQueueClaimsNothingWhileEnqueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newEnv(t, queue.Config{})
	w := workerOn(t, admin, "pz", 5*time.Second)
	signals := queue.EnableTestSignals(w.c)
	w.run()
	streamCtx, stopStream := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var enqueued atomic.Int64
	wg.Go(func() {
		for streamCtx.Err() == nil {
			if _, err := admin.c.Enqueue(streamCtx, queue.NewJob{Queue: "pz", Kind: "work"}); err != nil {
				if streamCtx.Err() == nil {
					t.Errorf("enqueue: %v", err)
				}
				return
			}
			enqueued.Add(1)
			time.Sleep(5 * time.Millisecond) // the stream's pace, not a wait
		}
	})
	defer func() { stopStream(); wg.Wait() }()
	waitFor(t, 10*time.Second, "the worker claiming", func() bool { return admin.count(`queue = 'pz' AND state = 'succeeded'`) > 0 })

	require.NoError(t, admin.c.PauseQueue(ctx, "pz"))
	waitFor(t, 5*time.Second, "the worker to know of the pause", func() bool {
		return w.metric("pgwake_queue_paused", map[string]string{"queue": "pz"}) == 1
	})
	signals.WaitPausedLooks(t, "pz", 1) // its dispatcher met the pause: it claims nothing more
	waitFor(t, 5*time.Second, "claims in flight to end", func() bool {
		return admin.countSQL(`SELECT count(*) FROM `+admin.table("attempts")) == 0
	})
	mark := admin.dbNow()
	from := enqueued.Load()
	waitFor(t, 60*time.Second, fmt.Sprintf("a job enqueued %s after the pause took hold", pausedHold), func() bool {
		return admin.count(`queue = 'pz' AND created_at >= $1`, mark.Add(pausedHold)) > 0
	})
	require.Zero(t, admin.count(`queue = 'pz' AND created_at > $1 AND state <> 'pending'`, mark), "a job enqueued while paused was claimed")
	require.Zero(t, admin.countSQL(`SELECT count(*) FROM `+admin.table("attempts")), "a claim is in flight while paused")
	held := admin.count(`queue = 'pz' AND created_at > $1 AND state = 'pending'`, mark)
	require.Greater(t, held, 0)
	require.GreaterOrEqual(t, int64(held), enqueued.Load()-from-1, "every job enqueued while paused is pending")
	t.Logf("pause: %d jobs enqueued over %s while paused, none claimed", held, pausedHold)

	require.NoError(t, admin.c.ResumeQueue(ctx, "pz"))
	waitFor(t, 10*time.Second, "jobs enqueued while paused to run", func() bool {
		return admin.count(`queue = 'pz' AND created_at > $1 AND state = 'succeeded'`, mark) > 0
	})
}

// A pause whose notification is lost (here: written to the table without
// one) is obeyed at the client's next poll of the table.
func TestPauseWithoutNotificationObeyedAtPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newEnv(t, queue.Config{})
	w := workerOn(t, admin, "pl", 50*time.Millisecond)
	signals := queue.EnableTestSignals(w.c)
	w.run()
	signals.WaitAsleep(t, "pl", 0) // running, before the pause
	_, err := admin.pool.Exec(ctx, `INSERT INTO `+admin.table("paused_queues")+` (queue) VALUES ('pl')`)
	require.NoError(t, err)
	signals.WaitPausedLooks(t, "pl", 1) // met at a poll: nothing was notified
	res, err := admin.c.Enqueue(ctx, queue.NewJob{Queue: "pl", Kind: "work"})
	require.NoError(t, err)
	signals.WaitPausedLooks(t, "pl", 3)
	require.Equal(t, 1, admin.count(`id = $1 AND state = 'pending'`, res.ID))
}

// A job running when its queue is paused finishes normally, in held and in
// leased mode.
func TestPauseLetsRunningJobsFinish(t *testing.T) {
	t.Parallel()
	for _, leased := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "leased"}[leased], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			started, release := make(chan struct{}, 1), make(chan struct{})
			cfg := queue.Config{Queues: map[string]queue.QueueConfig{"pf": {}}, Handlers: map[string]queue.Handler{
				"slow": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { started <- struct{}{}; <-release; return nil })}}
			if leased {
				cfg.LeasedKinds = []string{"slow"}
			}
			e := newEnv(t, cfg)
			e.run()
			res, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "pf", Kind: "slow"})
			require.NoError(t, err)
			select {
			case <-started:
			case <-time.After(10 * time.Second):
				t.Fatal("the job did not start")
			}
			require.NoError(t, e.c.PauseQueue(ctx, "pf"))
			waitFor(t, 5*time.Second, "the worker to know of the pause", func() bool {
				return e.metric("pgwake_queue_paused", map[string]string{"queue": "pf"}) == 1
			})
			close(release)
			waitFor(t, 10*time.Second, "the running job to succeed", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, res.ID) == 1 })
		})
	}
}

// The pause is stored: a client started later obeys it, Queues and the
// gauge show it, and a resume lets the job run.
func TestPauseSurvivesClientRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := newEnv(t, queue.Config{})
	require.ErrorIs(t, admin.c.PauseQueue(ctx, "Not A Queue"), queue.ErrInvalidQueue)
	require.NoError(t, admin.c.PauseQueue(ctx, "pr"))
	require.NoError(t, admin.c.PauseQueue(ctx, "pr"), "pausing twice is fine")
	res, err := admin.c.Enqueue(ctx, queue.NewJob{Queue: "pr", Kind: "work"})
	require.NoError(t, err)

	w := workerOn(t, admin, "pr", 50*time.Millisecond)
	signals := queue.EnableTestSignals(w.c)
	stop := w.run()
	waitFor(t, 5*time.Second, "the gauge", func() bool { return w.metric("pgwake_queue_paused", map[string]string{"queue": "pr"}) == 1 })
	signals.WaitPausedLooks(t, "pr", 4) // the pause met, then three polls: still nothing claimed
	require.Equal(t, 1, admin.count(`id = $1 AND state = 'pending'`, res.ID))
	stop()

	qs, err := admin.c.Queues(ctx)
	require.NoError(t, err)
	require.Len(t, qs, 1)
	require.Equal(t, "pr", qs[0].Queue)
	require.True(t, qs[0].Paused)
	require.False(t, qs[0].PausedAt.IsZero())

	w2 := workerOn(t, admin, "pr", 5*time.Second)
	w2.run()
	require.NoError(t, admin.c.ResumeQueue(ctx, "pr"))
	waitFor(t, 5*time.Second, "the job to run", func() bool { return admin.count(`id = $1 AND state = 'succeeded'`, res.ID) == 1 })
	require.Equal(t, 0.0, w2.metric("pgwake_queue_paused", map[string]string{"queue": "pr"}))
	qs, err = admin.c.Queues(ctx)
	require.NoError(t, err)
	for _, q := range qs {
		require.False(t, q.Paused, q.Queue)
	}
}
