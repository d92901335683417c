package queue_test

import (
	"context"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// effectLocks counts the open transactions holding a write on effects: a
// handler's uncommitted effect.
func (e *env) effectLocks() int {
	return e.countSQL(`SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE c.relname = 'effects' AND c.relnamespace = $1::regnamespace AND l.mode = 'RowExclusiveLock'`, e.schema)
}

// A leased worker process paused (SIGSTOP) past its lease, whose job was
// rescued meanwhile, resumes (SIGCONT) while the rescued job waits for its
// retry: its handler's late failure is refused (the rescue's record stays,
// the attempt is not counted twice) and its effect rolls back. The job's
// next run then succeeds once, at attempt 2.
func TestPausedLeasedWorkerLateFailureIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "effect", Payload: map[string]bool{"failfirst": true}})
	require.NoError(t, err)
	cmd := startHelperWith(t, e, 1500*time.Millisecond, "PGWAKE_TEST_LEASED=effect")
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	waitFor(t, 30*time.Second, "leased job running", func() bool { return e.count(`id = $1 AND state = 'running'`, r.ID) == 1 })
	waitFor(t, 30*time.Second, "effect written", func() bool { return e.effectLocks() == 1 })
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	rescuer := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues:        map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		LeasedKinds:   []string{"effect"},
		LeaseDuration: 1200 * time.Millisecond,
		// The rescued job waits 3 s for its retry: the paused worker
		// resumes meanwhile.
		Backoff:  func(int) time.Duration { return 3 * time.Second },
		Handlers: map[string]queue.Handler{"effect": effectHandler(e.schema, 0)},
	})
	rescuer.run()
	waitFor(t, 30*time.Second, "rescued", func() bool {
		return e.count(`id = $1 AND state = 'pending' AND attempts = 1 AND last_error LIKE 'lease expired%'`, r.ID) == 1
	})
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	stopped = false
	waitFor(t, 30*time.Second, "the paused worker's transaction to end", func() bool { return e.effectLocks() == 0 })
	// Its handler returned (the effect's transaction ended): the late
	// failure did not touch the job, unless the retry already ran.
	var state string
	var attempts int
	var lastErr string
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT state, attempts, coalesce(last_error, '') FROM `+e.table("jobs")+` WHERE id = $1`, r.ID).Scan(&state, &attempts, &lastErr))
	if state == "pending" {
		require.Equal(t, 1, attempts, "the late failure counted the attempt again")
		require.Contains(t, lastErr, "lease expired", "the late failure overwrote the rescue's record")
	}
	waitFor(t, 30*time.Second, "the retry succeeded", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, r.ID) == 1 })
	require.Equal(t, 1, e.count(`id = $1 AND state = 'succeeded' AND attempts = 2`, r.ID))
	require.Equal(t, 1, e.effectCounts()[r.ID], "one committed effect")
	require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM `+e.table("effects")+` WHERE job_id = $1 AND attempt = 2`, r.ID))
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventStarted, queue.EventRetryScheduled, queue.EventStarted, queue.EventSucceeded}, e.eventTypes(r.ID))
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A held-mode worker process paused (SIGSTOP) mid-handler keeps its claim:
// another worker of the queue, busy and looking for lost attempts every
// 100 ms, runs other jobs but never the paused one; once resumed
// (SIGCONT), the paused worker completes it, once, attempt 1.
func TestPausedHeldWorkerKeepsItsJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "effect"})
	require.NoError(t, err)
	cmd := startHelperWith(t, e, 1500*time.Millisecond)
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	waitFor(t, 30*time.Second, "effect written", func() bool { return e.effectLocks() == 1 })
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	ran := make(chan int64, 1000)
	other := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		PollInterval: 100 * time.Millisecond,
		Handlers: map[string]queue.Handler{"effect": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return effect(ctx, tx, e.schema, j)
		})},
	})
	other.run()
	// Several rounds of other jobs, each after a few of the other worker's
	// polls: its looks for lost attempts had every chance to take the
	// paused job.
	var others []int64
	for round := 0; round < 5; round++ {
		res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "effect", Delay: 300 * time.Millisecond})
		require.NoError(t, err)
		others = append(others, res.ID)
		waitFor(t, 30*time.Second, "another job done", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, res.ID) == 1 })
	}
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending' AND attempts = 0`, r.ID))
	require.Equal(t, 1, e.effectLocks(), "the paused worker's claim is still open")
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	stopped = false
	waitFor(t, 30*time.Second, "the paused job done", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, r.ID) == 1 })
	require.Equal(t, 1, e.count(`id = $1 AND attempts = 1`, r.ID))
	close(ran)
	for id := range ran {
		require.NotEqual(t, r.ID, id, "the other worker ran the paused worker's job")
	}
	counts := e.effectCounts()
	require.Equal(t, 1, counts[r.ID])
	for _, id := range others {
		require.Equal(t, 1, counts[id])
	}
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventSucceeded}, e.eventTypes(r.ID))
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A client process running a periodic schedule is paused (SIGSTOP) and
// resumed (SIGCONT) again and again, for random spells of up to 1.5 s,
// while another client runs the same schedule without pause: every slot
// from the first to the last has at most one job (exactly one unless the
// unpaused client starved past the 1 s lead: gaps are logged, not asserted).
func TestPausedPeriodicClientEnqueuesNoSlotTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	cmd := startHelperWith(t, e, 0, "PGWAKE_TEST_PERIODIC=1")
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	newEnvOn(t, e.pool, e.schema, queue.Config{Periodic: tickSchedule(false), PollInterval: time.Second}).run()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var paused time.Duration
	for range 8 {
		<-time.After(time.Duration(rng.Int64N(int64(periodicEvery)))) // a random moment in a slot
		require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
		d := time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
		<-time.After(d)
		paused += d
		require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	}
	slots := e.slots()
	require.NotEmpty(t, slots)
	gaps := 0
	for i := 1; i < len(slots); i++ {
		d := slots[i].Sub(slots[i-1])
		require.Positive(t, d, "two jobs for slot %s", slots[i])
		require.Zero(t, d%periodicEvery, "slot %s is not on the schedule", slots[i])
		if d > periodicEvery {
			gaps++ // the unpaused client starved past the 1 s lead on a loaded machine: missed, not doubled
		}
	}
	t.Logf("gaps: %d", gaps)
	t.Logf("%d slots, one job each; the helper was paused 8 times, %s in all", len(slots), paused)
}

// A session that holds the row lock of one of a worker's leased jobs (a
// rescuer paused between its SELECT ... FOR UPDATE of an expired lease and
// its commit, an operator's open transaction) must not stall the worker's
// heartbeat for its other jobs: their leases would expire and another
// worker would run them while their handlers still run here, uncancelled.
func TestLockedLeaseDoesNotStallTheHeartbeat(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	type start struct {
		id     int64
		client string
	}
	starts := make(chan start, 100)
	ended := make(chan int64, 100)
	handler := func(client string) queue.Handler {
		return queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			starts <- start{j.ID, client}
			<-ctx.Done()
			ended <- j.ID
			return context.Cause(ctx)
		})
	}
	a := newEnv(t, queue.Config{
		Queues:          map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		LeasedKinds:     []string{"long"},
		LeaseDuration:   1500 * time.Millisecond,
		JobTimeout:      time.Minute,
		ShutdownTimeout: 100 * time.Millisecond,
		Handlers:        map[string]queue.Handler{"long": handler("a")},
	})
	res, err := a.c.EnqueueMany(ctx, []queue.NewJob{{Kind: "long"}, {Kind: "long"}})
	require.NoError(t, err)
	x, y := res[0].ID, res[1].ID
	require.Less(t, x, y)
	a.run()
	for range 2 {
		select {
		case s := <-starts:
			require.Equal(t, "a", s.client)
		case <-time.After(30 * time.Second):
			t.Fatal("jobs did not start")
		}
	}
	// Lock x's row, as a paused rescuer would.
	lock, err := a.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `SELECT 1 FROM `+a.table("jobs")+` WHERE id = $1 FOR UPDATE`, x)
	require.NoError(t, err)
	// Another worker of the queue rescues what expires.
	b := newEnvOn(t, a.pool, a.schema, queue.Config{
		Queues:          map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		LeasedKinds:     []string{"long"},
		LeaseDuration:   1500 * time.Millisecond,
		ShutdownTimeout: 100 * time.Millisecond,
		Backoff:         func(int) time.Duration { return 0 },
		Handlers:        map[string]queue.Handler{"long": handler("b")},
	})
	b.run()
	// Six lease durations: y's lease is extended (it is not locked) and
	// y runs only on a; had it expired, b would have rescued and started it.
	deadline := time.After(9 * time.Second)
	for {
		select {
		case s := <-starts:
			t.Fatalf("job %d started on %s while a still ran it (x %d, y %d): a's heartbeat stalled behind x's lock", s.id, s.client, x, y)
		case <-deadline:
			require.Equal(t, 1, a.count(`id = $1 AND state = 'running' AND attempts = 1`, y))
			require.NoError(t, lock.Rollback(ctx))
			return
		}
	}
}
