package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// probeRuns counts handler runs per job id (every run, also those whose
// writes roll back).
type probeRuns struct {
	mu   sync.Mutex
	runs map[int64]int
	by   map[string]int
}

func newProbeRuns() *probeRuns { return &probeRuns{runs: map[int64]int{}, by: map[string]int{}} }

func (r *probeRuns) add(id int64, who string) {
	r.mu.Lock()
	r.runs[id]++
	r.by[who]++
	r.mu.Unlock()
}

func (r *probeRuns) snapshot() (map[int64]int, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	runs, by := map[int64]int{}, map[string]int{}
	for k, v := range r.runs {
		runs[k] = v
	}
	for k, v := range r.by {
		by[k] = v
	}
	return runs, by
}

// Two pgwake schemas in one database with the same queue name, the same
// kinds, the same unique keys and the same periodic schedule name: a pause
// in one does not pause the other, unique keys do not collide, each
// schema's jobs run only in its own clients, once each, woken by NOTIFY
// (polls are a minute), and each event log matches its jobs table.
func TestTwoSchemasInOneDatabaseShareNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	counts := map[string]*probeRuns{"a": newProbeRuns(), "b": newProbeRuns()}
	mk := func(name string) *env {
		var e *env
		h := queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			counts[name].add(j.ID, name)
			return effect(ctx, tx, e.schema, j)
		})
		e = newEnvWithPool(t, pool, queue.Config{
			Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
			Handlers:     map[string]queue.Handler{"x": h, "tick": h},
			PollInterval: time.Minute,
			Periodic: []queue.PeriodicJob{{Name: "same", Spec: "@every 200ms",
				Job: queue.NewJob{Kind: "tick", Queue: "default"}, SkipMissed: true}},
		})
		return e
	}
	a, b := mk("a"), mk("b")
	require.NotEqual(t, a.schema, b.schema)
	require.NoError(t, a.c.PauseQueue(ctx, "default"))
	a.run()
	b.run()

	var ida, idb []int64
	for i := range 20 {
		key := fmt.Sprintf("k%d", i)
		ra, err := a.c.Enqueue(ctx, queue.NewJob{Kind: "x", UniqueKey: key})
		require.NoError(t, err)
		rb, err := b.c.Enqueue(ctx, queue.NewJob{Kind: "x", UniqueKey: key})
		require.NoError(t, err)
		require.False(t, ra.Duplicate || rb.Duplicate, "key %s: a duplicate across schemas", key)
		ida, idb = append(ida, ra.ID), append(idb, rb.ID)
	}
	waitFor(t, 10*time.Second, "b's jobs run while a is paused", func() bool {
		return b.count(`kind = 'x' AND state = 'succeeded'`) == 20 && b.count(`kind = 'tick' AND state = 'succeeded'`) >= 3
	})
	require.Zero(t, a.count(`state <> 'pending'`), "a's paused queue ran jobs")
	paused, err := b.c.QueueStats(ctx, queue.QueueStatsParams{})
	require.NoError(t, err)
	for _, s := range paused {
		require.False(t, s.Paused, "b's queue %s shows paused", s.Queue)
	}
	require.NoError(t, a.c.ResumeQueue(ctx, "default"))
	waitFor(t, 10*time.Second, "a's jobs run after the resume", func() bool {
		return a.count(`kind = 'x' AND state = 'succeeded'`) == 20
	})
	for name, ids := range map[string][]int64{"a": ida, "b": idb} {
		runs, by := counts[name].snapshot()
		for _, id := range ids {
			require.Equal(t, 1, runs[id], "schema %s job %d runs", name, id)
		}
		require.Len(t, by, 1, "schema %s's jobs ran in %v", name, by)
	}
	// The SQL API of one schema enqueues into that schema only.
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT `+a.table("enqueue")+`('x', '{}'::jsonb)`).Scan(&id))
	waitFor(t, 10*time.Second, "the SQL API's job run in a", func() bool { return a.count(`id = $1 AND state = 'succeeded'`, id) == 1 })
	checkEventsMatchJobs(t, pool, a.schema)
	checkEventsMatchJobs(t, pool, b.schema)
}

// Twenty clients (half of them running the kind leased) on one queue, each
// on a pool of three connections: every job runs exactly once (handler runs
// counted in memory, not only committed effects), none is left, and no
// client is starved of work.
func TestTwentyClientsOnSmallPoolsRunEachJobOnce(t *testing.T) {
	t.Parallel()
	base := newEnv(t, queue.Config{})
	rc := newProbeRuns()
	var stops []func()
	for i := range 20 {
		who := fmt.Sprintf("c%d", i)
		p := pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 3 })
		cfg := queue.Config{
			Queues: map[string]queue.QueueConfig{"many": {MaxWorkers: 2}},
			Handlers: map[string]queue.Handler{"w": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				rc.add(j.ID, who)
				time.Sleep(time.Millisecond)
				return effect(ctx, tx, base.schema, j)
			})},
			AllowSmallPool: true,
			PollInterval:   time.Second,
			LeaseDuration:  5 * time.Second,
		}
		if i%2 == 1 {
			cfg.LeasedKinds = []string{"w"}
		}
		stops = append(stops, newEnvOn(t, p, base.schema, cfg).run())
	}
	const n = 2000
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "many", Kind: "w"}
	}
	var ids []int64
	for i := 0; i < n; i += 100 {
		ids = append(ids, base.enqueueIDs(jobs[i:i+100]...)...)
	}
	waitFor(t, 60*time.Second, "every job done", func() bool { return base.count(`state = 'succeeded'`) == n })
	for _, s := range stops {
		s()
	}
	base.requireExactlyOnce(ids)
	runs, by := rc.snapshot()
	for _, id := range ids {
		require.Equal(t, 1, runs[id], "job %d handler runs", id)
	}
	t.Logf("jobs per client: %v", by)
	require.Len(t, by, 20, "clients that ran no job")
	checkEventsMatchJobs(t, base.pool, base.schema)
}

// One client runs kind z leased, another runs it held (a deploy that moves
// z to leased mode, half rolled out): every z job runs exactly once.
func TestKindHeldInOneClientLeasedInAnotherRunsOnce(t *testing.T) {
	t.Parallel()
	base := newEnv(t, queue.Config{})
	rc := newProbeRuns()
	mk := func(who string, leased bool) {
		cfg := queue.Config{
			Queues: map[string]queue.QueueConfig{"mix": {MaxWorkers: 4}},
			Handlers: map[string]queue.Handler{"z": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				rc.add(j.ID, who)
				return effect(ctx, tx, base.schema, j)
			})},
			PollInterval:  time.Second,
			LeaseDuration: 2 * time.Second,
		}
		if leased {
			cfg.LeasedKinds = []string{"z"}
		}
		newEnvOn(t, base.pool, base.schema, cfg).run()
	}
	mk("held", false)
	mk("leased", true)
	jobs := make([]queue.NewJob, 500)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: "mix", Kind: "z"}
	}
	ids := base.enqueueIDs(jobs...)
	waitFor(t, 60*time.Second, "every job done", func() bool { return base.count(`state = 'succeeded'`) == len(ids) })
	base.requireExactlyOnce(ids)
	runs, by := rc.snapshot()
	for _, id := range ids {
		require.Equal(t, 1, runs[id], "job %d handler runs", id)
	}
	t.Logf("jobs per mode: %v", by)
	checkEventsMatchJobs(t, base.pool, base.schema)
}

// A client with Queues and no Handlers would claim every job of its queues
// and fail it ("no handler registered"), next to the workers that can run
// them: River refuses such a config ("Workers must be set if Queues is
// set"). New refuses it.
func TestQueuesWithoutHandlersAreRefused(t *testing.T) {
	t.Parallel()
	_, err := queue.New(pgtest.Pool(t), queue.Config{
		Queues:         map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		AllowSmallPool: true,
	})
	require.ErrorIs(t, err, queue.ErrInvalidConfig)
}

// A rolling deploy: client A has handlers for x and y, client B (the old
// version) only for x. B claims y jobs and fails their attempts
// (documented: "no handler registered"); with the default MaxAttempts of 5
// and a short backoff some y jobs end failed (seen with a 100 ms backoff),
// so here they get 25 attempts and every job runs exactly once.
func TestRollingDeployKindUnknownToOneClient(t *testing.T) {
	t.Parallel()
	base := newEnv(t, queue.Config{})
	mk := func(kinds ...string) *env {
		hs := map[string]queue.Handler{}
		for _, k := range kinds {
			hs[k] = queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				return effect(ctx, tx, base.schema, j)
			})
		}
		e := newEnvOn(t, base.pool, base.schema, queue.Config{
			Queues:       map[string]queue.QueueConfig{"roll": {MaxWorkers: 4}},
			Handlers:     hs,
			PollInterval: time.Second,
			Backoff:      func(int) time.Duration { return 100 * time.Millisecond },
			MaxAttempts:  25,
		})
		e.run()
		return e
	}
	mk("x", "y")
	mk("x")
	jobs := make([]queue.NewJob, 0, 200)
	for i := range 100 {
		_ = i
		jobs = append(jobs, queue.NewJob{Queue: "roll", Kind: "x", MaxAttempts: 25}, queue.NewJob{Queue: "roll", Kind: "y", MaxAttempts: 25})
	}
	ids := base.enqueueIDs(jobs...)
	waitFor(t, 60*time.Second, "every job done", func() bool { return base.count(`state = 'succeeded'`) == len(ids) })
	base.requireExactlyOnce(ids)
	t.Logf("jobs with a failed attempt: x %d, y %d; attempts over all jobs: %d",
		base.count(`kind = 'x' AND attempts > 1`), base.count(`kind = 'y' AND attempts > 1`),
		base.countSQL(`SELECT sum(attempts) FROM `+base.table("jobs")))
}
