package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

// Tests of "every attempt counted, every job on its own": whatever ends a
// claim transaction early counts the attempt of the job at fault and no
// other, and no job's outcome or start depends on the jobs claimed with it.

// runCounter counts handler runs per job.
type runCounter struct{ m sync.Map }

func (r *runCounter) add(id int64) {
	v, _ := r.m.LoadOrStore(id, new(atomic.Int32))
	v.(*atomic.Int32).Add(1)
}

func (r *runCounter) get(id int64) int {
	if v, ok := r.m.Load(id); ok {
		return int(v.(*atomic.Int32).Load())
	}
	return 0
}

// fastBackoff retries at once-ish, so tests see every attempt.
func fastBackoff(int) time.Duration { return 20 * time.Millisecond }

// eventTypes returns a job's event types in order.
func (e *env) eventTypes(id int64) []queue.EventType {
	e.t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT type FROM `+e.table("events")+` WHERE job_id = $1 ORDER BY id`, id)
	require.NoError(e.t, err)
	types, err := pgx.CollectRows(rows, pgx.RowTo[queue.EventType])
	require.NoError(e.t, err)
	return types
}

// warmUp runs one job of kind so the worker knows its handler time and
// batches it.
func (e *env) warmUp(kind string) {
	e.t.Helper()
	r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: kind, Payload: map[string]any{"warm": true}})
	require.NoError(e.t, err)
	waitFor(e.t, 30*time.Second, "warm-up job", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, r.ID) == 1 })
}

// A handler whose write violates a deferred constraint fails at COMMIT. The
// culprit's attempts count (with backoff) until it fails for good; the jobs
// claimed with it succeed exactly once; handlers run a bounded number of times.
func TestCommitFailureCountsTheCulpritOnly(t *testing.T) {
	t.Parallel()
	var schema string
	var runs runCounter
	e := newEnv(t, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{"w": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			runs.add(j.ID)
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			var p struct{ Bad bool }
			_ = json.Unmarshal(j.Payload, &p)
			if p.Bad {
				_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.deferred (k) VALUES (1)`)
				return err
			}
			return nil
		})},
	})
	schema = e.schema
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `CREATE TABLE `+e.table("deferred")+` (k int UNIQUE DEFERRABLE INITIALLY DEFERRED); INSERT INTO `+e.table("deferred")+` VALUES (1)`)
	require.NoError(t, err)
	jobs := make([]queue.NewJob, 25)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "w", MaxAttempts: 3, Payload: map[string]any{"bad": i == 3, "i": i}}
	}
	res, err := e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	culprit := res[3].ID
	var good []int64
	for i, r := range res {
		if i != 3 {
			good = append(good, r.ID)
		}
	}
	e.run()
	waitFor(t, 60*time.Second, "culprit failed and the rest succeeded", func() bool {
		return e.count(`id = $1 AND state = 'failed'`, culprit) == 1 && e.count(`state = 'succeeded'`) == len(good)
	})
	require.Equal(t, 1, e.count(`id = $1 AND attempts = 3 AND last_error LIKE 'commit failed%'`, culprit))
	require.LessOrEqual(t, runs.get(culprit), 6, "at most a batch run and a lone run per attempt")
	for _, id := range good {
		require.LessOrEqual(t, runs.get(id), 2, "job %d ran more than a batch run and a lone run", id)
	}
	require.Equal(t, len(good), e.count(`state = 'succeeded' AND attempts = 1`), "neighbours charged an attempt")
	counts := e.effectCounts()
	for _, id := range good {
		require.Equal(t, 1, counts[id], "job %d: committed effects", id)
	}
	require.Zero(t, counts[culprit])
	require.Zero(t, e.countSQL(`SELECT count(*) FROM `+e.table("attempts")))
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A job that kills its worker process (os.Exit, SIGKILL) counts an attempt
// per death it caused and ends failed after MaxAttempts; the rest drains,
// each job exactly once and never charged for the poison job's deaths.
// kill-first dies before its handler's first statement, while the attempt
// record may still be held in the corked socket (cork_linux.go).
func TestPoisonJobKillingItsProcessEndsFailed(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"exit", "kill", "kill-first"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, queue.Config{})
			ctx := context.Background()
			jobs := make([]queue.NewJob, 40)
			for i := range jobs {
				jobs[i] = queue.NewJob{Kind: "effect", MaxAttempts: 3, Payload: map[string]any{"i": i}}
			}
			jobs[0].Payload = map[string]any{"die": how}
			jobs[0].Priority = -1 // first in line, as a stuck poison job would be
			res, err := e.c.EnqueueMany(ctx, jobs)
			require.NoError(t, err)
			poison := res[0].ID
			deaths := 0
			for deaths < 12 && !(e.count(`id = $1 AND state = 'failed'`, poison) == 1 && e.count(`state = 'succeeded'`) == len(jobs)-1) {
				cmd := startHelper(t, e, 0)
				exited := make(chan struct{})
				go func() { _ = cmd.Wait(); close(exited) }()
				deadline := time.After(30 * time.Second)
			wait:
				for {
					select {
					case <-exited:
						deaths++
						break wait
					case <-deadline:
						t.Fatal("helper neither died nor finished")
					case <-time.After(20 * time.Millisecond):
						if e.count(`id = $1 AND state = 'failed'`, poison) == 1 && e.count(`state = 'succeeded'`) == len(jobs)-1 {
							_ = cmd.Process.Kill()
							<-exited
							break wait
						}
					}
				}
			}
			require.Equal(t, 1, e.count(`id = $1 AND state = 'failed' AND attempts = 3 AND last_error LIKE 'attempt lost%'`, poison))
			require.Equal(t, len(jobs)-1, e.count(`state = 'succeeded' AND attempts = 1`), "neighbours charged an attempt")
			require.GreaterOrEqual(t, deaths, 3)
			require.LessOrEqual(t, deaths, 9, "each counted attempt costs at most three deaths")
			counts := e.effectCounts()
			for _, r := range res[1:] {
				require.Equal(t, 1, counts[r.ID], "job %d: committed effects", r.ID)
			}
			checkEventsMatchJobs(t, e.pool, e.schema)
		})
	}
}

// An operator terminating the claim's backend mid-handler counts the attempt.
func TestTerminatedBackendCountsTheAttempt(t *testing.T) {
	t.Parallel()
	pids := make(chan int32, 1)
	release := make(chan struct{})
	var runs atomic.Int32
	e := newEnv(t, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff: func(int) time.Duration { return time.Hour },
		Handlers: map[string]queue.Handler{"t": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			runs.Add(1)
			var pid int32
			if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			<-release
			return nil
		})},
	})
	r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "t"})
	require.NoError(t, err)
	e.run()
	pid := <-pids
	// The attempt record is sent before the handler starts and commits
	// while it runs; a backend killed before that commit leaves no record
	// (the window docs/semantics.md names). This test is about a handler
	// killed mid-run: wait for the record first.
	waitFor(t, 30*time.Second, "the attempt record", func() bool {
		var n int
		require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.table("attempts")+` WHERE job_id = $1`, r.ID).Scan(&n))
		return n == 1
	})
	_, err = e.pool.Exec(context.Background(), `SELECT pg_terminate_backend($1, 10000)`, pid) // waits until it is gone
	require.NoError(t, err)
	close(release)
	waitFor(t, 30*time.Second, "attempt recorded", func() bool { return e.count(`id = $1 AND attempts = 1`, r.ID) == 1 })
	var state queue.JobState
	var lastError string
	var retryIn time.Duration
	require.NoError(t, e.pool.QueryRow(context.Background(), `SELECT state, coalesce(last_error, ''), run_after - now() FROM `+e.table("jobs")+` WHERE id = $1`, r.ID).Scan(&state, &lastError, &retryIn))
	require.Equal(t, queue.StatePending, state, "runs %d, events %v", runs.Load(), e.eventTypes(r.ID))
	require.Contains(t, lastError, "commit failed")
	require.Greater(t, retryIn, 50*time.Minute)
	require.Equal(t, int32(1), runs.Load())
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// cancelEnv is a one-slot worker whose kind "c" either records its effect or
// cancels the job named in its payload, the way the payload says.
func cancelEnv(t *testing.T) (*env, *runCounter) {
	var runs runCounter
	var e *env
	e = newEnv(t, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{"c": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			runs.add(j.ID)
			var p struct {
				Cancel int64
				Via    string
			}
			_ = json.Unmarshal(j.Payload, &p)
			if err := effect(ctx, tx, e.schema, j); err != nil {
				return err
			}
			switch p.Via {
			case "tx":
				return e.c.CancelTx(ctx, tx, p.Cancel)
			case "pool":
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				return e.c.Cancel(cctx, p.Cancel)
			}
			return nil
		})},
	})
	return e, &runs
}

// A job cancelled after it was claimed with its canceller never runs and is
// never marked succeeded; cancelling through the pool does not wait for the
// batch; a handler cancelling its own job leaves it cancelled.
func TestCancelOfAClaimedJob(t *testing.T) {
	t.Parallel()
	for _, via := range []string{"tx", "pool"} {
		t.Run("neighbour via "+via, func(t *testing.T) {
			t.Parallel()
			e, runs := cancelEnv(t)
			e.run()
			e.warmUp("c")
			ctx := context.Background()
			var a, b queue.EnqueueResult
			// One commit: the idle worker claims both in one batch, a first.
			err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
				var err error
				if b, err = e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "c"}); err != nil {
					return err
				}
				a, err = e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "c", Priority: -1, Payload: map[string]any{"cancel": b.ID, "via": via}})
				return err
			})
			require.NoError(t, err)
			waitFor(t, 30*time.Second, "canceller done", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, a.ID) == 1 })
			require.Equal(t, 1, e.count(`id = $1 AND state = 'cancelled'`, b.ID))
			require.Zero(t, runs.get(b.ID), "the cancelled job ran")
			require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventCancelled}, e.eventTypes(b.ID))
			checkEventsMatchJobs(t, e.pool, e.schema)
		})
	}
	t.Run("own job", func(t *testing.T) {
		t.Parallel()
		e, runs := cancelEnv(t)
		e.run()
		ctx := context.Background()
		var own queue.EnqueueResult
		err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
			var err error
			own, err = e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "c", RunAfter: time.Now().Add(time.Hour)})
			if err != nil {
				return err
			}
			// Make it due and point it at itself.
			_, err = tx.Exec(ctx, `UPDATE `+e.table("jobs")+` SET run_after = now(), payload = jsonb_build_object('cancel', id, 'via', 'tx') WHERE id = $1`, own.ID)
			return err
		})
		require.NoError(t, err)
		waitFor(t, 30*time.Second, "job finished", func() bool { return e.count(`id = $1 AND state <> 'pending'`, own.ID) == 1 })
		require.Equal(t, 1, e.count(`id = $1 AND state = 'cancelled'`, own.ID))
		require.Equal(t, 1, runs.get(own.ID))
		require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventCancelled}, e.eventTypes(own.ID))
		checkEventsMatchJobs(t, e.pool, e.schema)
	})
}

// A handler whose first statement fails at Parse fails its own attempt only:
// the jobs claimed with it run once and succeed.
func TestParseErrorFailsOnlyItsJob(t *testing.T) {
	t.Parallel()
	var runs runCounter
	var schema string
	e := newEnv(t, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		Backoff: func(int) time.Duration { return time.Hour },
		Handlers: map[string]queue.Handler{"p": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			runs.add(j.ID)
			var p struct{ Typo bool }
			_ = json.Unmarshal(j.Payload, &p)
			if p.Typo {
				_, err := tx.Exec(ctx, `SELECT * FROM table_that_is_not_migrated_yet`)
				return err
			}
			return effect(ctx, tx, schema, j)
		})},
	})
	schema = e.schema
	e.run()
	e.warmUp("p")
	ctx := context.Background()
	jobs := make([]queue.NewJob, 9)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "p", Payload: map[string]any{"typo": i == 4, "i": i}}
	}
	res, err := e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "batch done", func() bool { return e.count(`state = 'succeeded'`) == len(jobs) })
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending' AND attempts = 1 AND last_error LIKE '%does not exist%'`, res[4].ID))
	for i, r := range res {
		require.Equal(t, 1, runs.get(r.ID), "job %d runs", i)
	}
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A handler that ends the claim transaction with SQL fails loudly: each run
// is a counted, failed attempt and the job is never marked succeeded.
func TestHandlerEndingTheTransactionFails(t *testing.T) {
	t.Parallel()
	for _, stmt := range []string{"COMMIT", "ROLLBACK"} {
		t.Run(stmt, func(t *testing.T) {
			t.Parallel()
			var runs atomic.Int32
			var schema string
			e := newEnv(t, queue.Config{
				Queues:  map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
				Backoff: fastBackoff,
				Handlers: map[string]queue.Handler{"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					runs.Add(1)
					if err := effect(ctx, tx, schema, j); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, stmt)
					return err
				})},
			})
			schema = e.schema
			r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "x", MaxAttempts: 2})
			require.NoError(t, err)
			e.run()
			waitFor(t, 30*time.Second, "job failed", func() bool { return e.count(`id = $1 AND state = 'failed'`, r.ID) == 1 })
			require.Equal(t, 1, e.count(`id = $1 AND attempts = 2 AND last_error LIKE '%handler ended the claim transaction%'`, r.ID))
			require.Equal(t, int32(2), runs.Load())
			require.NotContains(t, e.eventTypes(r.ID), queue.EventSucceeded)
			checkEventsMatchJobs(t, e.pool, e.schema)
		})
	}
}

// A slow job does not hold the jobs of its batch: with slots free, fast jobs
// start promptly while slow ones run.
func TestSlowJobDoesNotHoldItsBatch(t *testing.T) {
	t.Parallel()
	const slowFor = 3 * time.Second
	var mu sync.Mutex
	started := map[int64]time.Time{}
	mark := func(id int64) {
		mu.Lock()
		started[id] = time.Now()
		mu.Unlock()
	}
	var schema string
	e := newEnvOwnPool(t, 12, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 8}},
		Handlers: map[string]queue.Handler{
			"fast": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				mark(j.ID)
				return effect(ctx, tx, schema, j)
			}),
			"slow": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				mark(j.ID)
				time.Sleep(slowFor)
				return nil
			}),
		},
	})
	schema = e.schema
	jobs := make([]queue.NewJob, 406)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "fast"}
		if i%68 == 1 {
			jobs[i] = queue.NewJob{Kind: "slow"}
		}
	}
	res, err := e.c.EnqueueMany(context.Background(), jobs)
	require.NoError(t, err)
	e.run()
	waitFor(t, 60*time.Second, "fast jobs done", func() bool { return e.count(`kind = 'fast' AND state = 'succeeded'`) == 400 })
	mu.Lock()
	defer mu.Unlock()
	// Jobs are claimed in id order. A fast job held in a batch behind a slow
	// one starts slowFor after fast jobs claimed later; a queue that is
	// merely busy starts them about in order. So measure, for each fast job,
	// how long after a later fast job it started.
	var fast []time.Time
	for i, r := range res {
		if jobs[i].Kind == "fast" {
			fast = append(fast, started[r.ID])
		}
	}
	var worst time.Duration
	laterMin := fast[len(fast)-1]
	for i := len(fast) - 2; i >= 0; i-- {
		worst = max(worst, fast[i].Sub(laterMin))
		if fast[i].Before(laterMin) {
			laterMin = fast[i]
		}
	}
	require.Less(t, worst, slowFor/2, "a fast job started %s after one claimed later", worst)
}

// Producers in REPEATABLE READ or SERIALIZABLE transactions, whose snapshot
// predates the worker's idle mark, still wake it.
func TestRepeatableReadProducersWakeIdleWorkers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		opts    pgx.TxOptions
		runtime string // default_transaction_isolation of the producer's pool
	}{
		{"repeatable read", pgx.TxOptions{IsoLevel: pgx.RepeatableRead}, ""},
		{"serializable", pgx.TxOptions{IsoLevel: pgx.Serializable}, ""},
		{"default serializable", pgx.TxOptions{}, "serializable"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := make(chan time.Time, 1)
			e := newEnv(t, queue.Config{
				Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
				PollInterval: time.Hour,
				Handlers: map[string]queue.Handler{"rr": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					got <- time.Now()
					return nil
				})},
			})
			producers := pgtest.NewPool(t, func(c *pgxpool.Config) {
				c.MaxConns = 2
				if tc.runtime != "" {
					c.ConnConfig.RuntimeParams["default_transaction_isolation"] = tc.runtime
				}
			})
			ctx := context.Background()
			// The producer's snapshot is taken before the worker exists.
			tx, err := producers.BeginTx(ctx, tc.opts)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, `SELECT count(*) FROM `+e.table("waiters"))
			require.NoError(t, err)
			signals := queue.EnableTestSignals(e.c)
			e.run()
			signals.WaitAsleep(t, "default", 0) // idle-marked, past the idle barrier and its last look
			require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM `+e.table("waiters")+` WHERE idle`))
			_, err = e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "rr"})
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			committed := time.Now()
			select {
			case at := <-got:
				require.Less(t, at.Sub(committed), 5*time.Second)
			case <-time.After(20 * time.Second):
				t.Fatal("job not started: the producer did not wake the idle worker")
			}
		})
	}
}

// New refuses a pool that cannot hold the workers, with a typed error, unless
// told to accept it.
func TestNewRejectsAPoolTooSmallForTheWorkers(t *testing.T) {
	t.Parallel()
	pool := pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	cfg := queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })},
	}
	require.Equal(t, 12, queue.MinPoolConns(cfg), "10 workers, 1 queue, 1 for pgwake")
	_, err := queue.New(pool, cfg)
	require.ErrorIs(t, err, queue.ErrPoolTooSmall)
	var pe *queue.PoolTooSmallError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, queue.PoolTooSmallError{MaxConns: 4, Need: 12}, *pe)

	cfg.AllowSmallPool = true
	_, err = queue.New(pool, cfg)
	require.NoError(t, err)

	// A producer-only client needs no workers' connections.
	_, err = queue.New(pool, queue.Config{})
	require.NoError(t, err)
}

// A job claimed as usual may carry a stale attempt record: the record of an
// attempt already counted, left behind. The new attempt's record replaces
// it (the record is a plain INSERT unless it meets one), so the attempt
// that runs is protected like any other and runs once.
func TestStaleAttemptRecordIsReplaced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var e *env
	var runs atomic.Int32
	var signals queue.Signals
	e = newEnv(t, queue.Config{
		Queues: map[string]queue.QueueConfig{"q": {}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
			runs.Add(1)
			// The record is written beside the handler: wait for it.
			if !signals.StartRecorded(j.ID, 10*time.Second) {
				return fmt.Errorf("attempt %d: no record committed", j.Attempt)
			}
			var attempt int
			err := e.pool.QueryRow(ctx, `SELECT attempt FROM `+e.table("attempts")+` WHERE job_id = $1`, j.ID).Scan(&attempt)
			if err != nil || attempt != j.Attempt {
				return fmt.Errorf("attempt %d has no record (record's attempt %d, %v)", j.Attempt, attempt, err)
			}
			return nil
		})},
	})
	signals = queue.EnableTestSignals(e.c)
	r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "q", Kind: "k"})
	require.NoError(t, err)
	// Attempt 1 was counted and its record stayed behind.
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET attempts = 1 WHERE id = $1`, r.ID)
	require.NoError(t, err)
	e.recordAttempt(e.pool, r.ID, 1, 2)
	defer e.run()()
	waitFor(t, 30*time.Second, "the job to finish", func() bool {
		return e.count(`id = $1 AND state <> 'pending'`, r.ID) == 1
	})
	var state, lastError string
	var attempts int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT state, attempts, coalesce(last_error, '') FROM `+e.table("jobs")+` WHERE id = $1`, r.ID).
		Scan(&state, &attempts, &lastError))
	require.Equal(t, string(queue.StateSucceeded), state, lastError)
	require.Equal(t, 2, attempts)
	require.EqualValues(t, 1, runs.Load())
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventSucceeded}, e.eventTypes(r.ID))
	require.Zero(t, e.countSQL(`SELECT count(*) FROM `+e.table("attempts")))
}

// Every lost attempt found at start runs again at once, not one per look:
// after a database restart the loops find several jobs whose attempts began
// and recorded no outcome (their records survive a clean shutdown), and
// each recovered job is followed by a look for the next. With a one-hour
// poll, the only other way back is the heartbeat's (every 20 s).
func TestLostAttemptsAreAllRecoveredAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var runs atomic.Int32
	e := newEnv(t, queue.Config{
		PollInterval: time.Hour,
		Queues:       map[string]queue.QueueConfig{"q": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			runs.Add(1)
			return nil
		})},
	})
	const n = 6
	for range n {
		r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "q", Kind: "k"})
		require.NoError(t, err)
		e.recordAttempt(e.pool, r.ID, 1, 0) // its attempt 1 began in a client that is gone
	}
	began := time.Now()
	defer e.run()()
	waitFor(t, 30*time.Second, "every job to finish", func() bool { return e.count(`state = 'succeeded'`) == n })
	require.Less(t, time.Since(began), 10*time.Second, "lost attempts recovered one per heartbeat (every 20 s)")
	require.EqualValues(t, n, runs.Load())
	require.Zero(t, e.countSQL(`SELECT count(*) FROM `+e.table("attempts")))
}

// A lost attempt is found while the queue is busy too: a loop working
// through a backlog looks for lost attempts at least every PollInterval,
// not only when the backlog ends. The lost job is not claimed as usual
// (its record hides it from the claims), so without that look it waited for
// the whole backlog.
func TestLostAttemptIsRecoveredWhileBusy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var lostRan atomic.Int64 // unix nanos
	var lostID atomic.Int64
	e := newEnv(t, queue.Config{
		PollInterval: 200 * time.Millisecond,
		Queues:       map[string]queue.QueueConfig{"q": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			if j.ID == lostID.Load() {
				lostRan.Store(time.Now().UnixNano())
				return nil
			}
			time.Sleep(5 * time.Millisecond)
			return nil
		})},
	})
	// A backlog of about 10 s for two workers.
	backlog := make([]queue.NewJob, 4000)
	for i := range backlog {
		backlog[i] = queue.NewJob{Queue: "q", Kind: "k"}
	}
	_, err := e.c.EnqueueMany(ctx, backlog)
	require.NoError(t, err)
	defer e.run()()
	waitFor(t, 30*time.Second, "the backlog to start", func() bool { return e.count(`state = 'succeeded'`) >= 100 })
	// A job whose attempt 1 began in a client that is gone: the job and its
	// record commit together. Its priority puts it after the backlog for
	// the usual claims.
	due := time.Now()
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	r, err := e.c.EnqueueTx(ctx, tx, queue.NewJob{Queue: "q", Kind: "k", Priority: 100})
	require.NoError(t, err)
	lostID.Store(r.ID)
	e.recordAttempt(tx, r.ID, 1, 0)
	require.NoError(t, tx.Commit(ctx))
	waitFor(t, 60*time.Second, "the lost job to run", func() bool { return lostRan.Load() != 0 })
	left := e.count(`state = 'pending'`)
	took := time.Unix(0, lostRan.Load()).Sub(due)
	t.Logf("the lost job ran %s after it was enqueued, %d backlog jobs still pending", took, left)
	require.Greater(t, left, 0, "the backlog ended first: nothing shown")
	require.Less(t, took, 3*time.Second)
}

// A lost attempt's job whose run_after was moved ahead (by hand, say)
// runs when it is due, not at the first look for lost attempts.
func TestLostAttemptWaitsForItsRunAfter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ran := make(chan time.Time, 1)
	e := newEnv(t, queue.Config{
		PollInterval: 200 * time.Millisecond,
		Queues:       map[string]queue.QueueConfig{"q": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			ran <- time.Now()
			return nil
		})},
	})
	r, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "q", Kind: "k", Delay: 1500 * time.Millisecond})
	require.NoError(t, err)
	e.recordAttempt(e.pool, r.ID, 1, 0) // its attempt 1 began in a client that is gone
	var due time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT run_after FROM `+e.table("jobs")+` WHERE id = $1`, r.ID).Scan(&due))
	defer e.run()()
	select {
	case at := <-ran:
		require.False(t, at.Before(due), "ran %s before its run_after", due.Sub(at))
	case <-time.After(30 * time.Second):
		t.Fatal("the lost job never ran")
	}
	waitFor(t, 10*time.Second, "the job to succeed", func() bool { return e.count(`state = 'succeeded'`) == 1 })
}

// recordAttempt writes, through q, the record that attempt of job id (in
// queue "q") began in a client that is gone, at isolation level isolation.
func (e *env) recordAttempt(q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, id int64, attempt, isolation int) {
	e.t.Helper()
	_, err := q.Exec(context.Background(), `INSERT INTO `+e.table("attempts")+` (job_id, queue, attempt, batch, client_id, isolation)
		VALUES ($1, 'q', $2, 1, 'gone', $3)`, id, attempt, isolation)
	require.NoError(e.t, err)
}
