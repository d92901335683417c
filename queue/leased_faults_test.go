package queue_test

import (
	"context"
	"errors"
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

// A leased handler returns just after the pool's idle connections were
// terminated (as by a database restart, or an operator): the outcome's
// first write fails on a dead connection and is written again on a new
// one, while the lease holds. Before, the outcome was lost: the job, once
// its lease expired, counted the attempt as failed ("lease expired") and,
// on its last attempt, ended failed though its handler had succeeded.
func TestLeasedOutcomeWrittenAfterALostConnection(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "success", true: "failure"}[fail], func(t *testing.T) {
			t.Parallel()
			started, proceed := make(chan int64, 1), make(chan struct{})
			var once sync.Once
			closeProceed := func() { once.Do(func() { close(proceed) }) }
			var runs atomic.Int32
			e := newEnvOwnPool(t, 3, queue.Config{
				AllowSmallPool: true,
				Queues:         map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
				LeasedKinds:    []string{"l"},
				LeaseDuration:  5 * time.Second,
				PollInterval:   time.Hour,
				Handlers: map[string]queue.Handler{"l": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					runs.Add(1)
					started <- j.ID
					<-proceed
					if fail {
						return errors.New("the handler's own error")
					}
					return nil
				})},
			})
			ctx := context.Background()
			r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "l", MaxAttempts: 1})
			require.NoError(t, err)
			e.run()
			// Registered after run's own cleanup, so it runs first: a
			// failed assertion before the handler is let go must not
			// leave Run waiting for it until the harness gives up.
			t.Cleanup(closeProceed)
			<-started
			// Every idle connection of the pool dies; pgxpool hands one
			// out as it is (it pings only those idle over a second).
			// One connection is taken by Acquire (it waits if the pool's
			// others are busy for a moment), the rest as they lie idle:
			// the handler's outcome write then gets a dead one.
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			held, err := e.pool.Acquire(actx)
			cancel()
			require.NoError(t, err)
			conns := append(e.pool.AcquireAllIdle(ctx), held)
			var pids []uint32
			for _, c := range conns {
				pids = append(pids, c.Conn().PgConn().PID())
			}
			_, err = pgtest.Pool(t).Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid`, pids)
			for _, c := range conns {
				c.Release()
			}
			require.NoError(t, err)
			closeProceed()
			want := "succeeded"
			if fail {
				want = "failed"
			}
			// Read on another pool: the test's own reads must not meet a
			// dead connection either.
			row := func() (state, lastErr string) {
				require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT state::text, coalesce(last_error, '') FROM `+e.table("jobs")+` WHERE id = $1`, r.ID).Scan(&state, &lastErr))
				return state, lastErr
			}
			waitFor(t, 20*time.Second, "the job's outcome", func() bool { st, _ := row(); return st == want })
			if fail {
				_, lastErr := row()
				require.Contains(t, lastErr, "the handler's own error", "the handler's error, not a lease expiry")
			}
			require.EqualValues(t, 1, runs.Load(), "the handler ran once")
		})
	}
}

// A leased claim commits without waiting for the WAL flush, so a database
// crash can undo it while its handler runs: the job is pending again and
// this client claims it again, with the same attempt number and owner.
// The first run is cancelled (ErrLeaseLost) as the second is registered,
// and its outcome is not written, which the new claim would accept as its
// own: only the new run completes the job. Before, the first run ran on
// beside the second, unseen by the heartbeat, and whichever returned first
// marked the job succeeded. The
// crash is played by putting the row back as the rolled-back claim left it.
func TestLostLeasedClaimCancelsTheFirstRun(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	firstCause := make(chan error, 1)
	second := make(chan struct{})
	e := newEnv(t, queue.Config{
		Queues:        map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		LeasedKinds:   []string{"l"},
		LeaseDuration: 30 * time.Second,
		PollInterval:  100 * time.Millisecond,
		Handlers: map[string]queue.Handler{"l": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if runs.Add(1) == 1 {
				<-ctx.Done()
				firstCause <- context.Cause(ctx)
				return nil // claims success: must not be written
			}
			<-second
			return nil
		})},
	})
	ctx := context.Background()
	r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "l"})
	require.NoError(t, err)
	e.run()
	waitFor(t, 20*time.Second, "the first run", func() bool { return runs.Load() == 1 })
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("jobs")+` SET state = 'pending', attempts = attempts - 1, leased_by = NULL, lease_expires_at = NULL WHERE id = $1`, r.ID)
	require.NoError(t, err)
	select {
	case cause := <-firstCause:
		require.ErrorIs(t, cause, queue.ErrLeaseLost)
	case <-time.After(20 * time.Second):
		t.Fatal("the first run was not cancelled when the job was claimed again")
	}
	waitFor(t, 10*time.Second, "the first run's outcome reported", func() bool {
		return e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "lease_lost"}) == 1
	})
	require.Equal(t, 1, e.count(`id = $1 AND state = 'running' AND attempts = 1`, r.ID), "the first run's success was not written")
	close(second)
	waitFor(t, 20*time.Second, "the second run's success", func() bool { return e.count(`id = $1 AND state = 'succeeded' AND attempts = 1`, r.ID) == 1 })
	require.EqualValues(t, 2, runs.Load())
}

// Leased handlers that used their tx and fail gave their connection back
// only after their failure was written, which takes another: with every
// pool connection a failing handler's, they waited for each other (the
// write's 30 s timeout, then the lease), the real error lost to "lease
// expired". The connection goes back first now.
func TestLeasedFailuresDoNotHoldThePool(t *testing.T) {
	t.Parallel()
	const conns = 3
	var schema string
	var wrote atomic.Int32
	allWrote := make(chan struct{})
	e := newEnvWithPool(t, pgtest.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = conns }), queue.Config{
		Queues:         map[string]queue.QueueConfig{"default": {MaxWorkers: 10}},
		Backoff:        fastBackoff,
		LeasedKinds:    []string{"k"},
		AllowSmallPool: true,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if j.Attempt > 1 {
				return nil
			}
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			if wrote.Add(1) == conns {
				close(allWrote)
			}
			select { // every pool connection is a handler's tx now
			case <-allWrote:
			case <-time.After(5 * time.Second):
			}
			return errors.New("fails after writing")
		})},
	})
	schema = e.schema
	jobs := make([]queue.NewJob, conns)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "k", MaxAttempts: 3}
	}
	ids := e.enqueueIDs(jobs...)
	e.run()
	waitFor(t, 20*time.Second, "each job's failure recorded and the retry succeeded", func() bool {
		return e.count(`state = 'succeeded' AND attempts = 2`) == len(ids)
	})
	require.Equal(t, len(ids), e.count(`last_error LIKE '%fails after writing%' OR last_error IS NULL`), "the handlers' own error, not a lease expiry")
	require.Empty(t, e.effectCounts(), "the failed attempts' writes rolled back")
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A leased handler that ends its transaction (COMMIT or ROLLBACK sent as
// SQL) fails its attempt with ErrTxEnded, as in held mode; it was marked
// succeeded, after ROLLBACK with its writes lost.
func TestLeasedHandlerEndingItsTransaction(t *testing.T) {
	t.Parallel()
	for _, stmt := range []string{"COMMIT", "ROLLBACK"} {
		t.Run(stmt, func(t *testing.T) {
			t.Parallel()
			var schema string
			e := newEnv(t, queue.Config{
				Queues:      map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
				Backoff:     fastBackoff,
				LeasedKinds: []string{"x"},
				Handlers: map[string]queue.Handler{"x": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
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
			waitFor(t, 20*time.Second, "job ended", func() bool { return e.count(`id = $1 AND state IN ('failed', 'succeeded')`, r.ID) == 1 })
			st, attempts, le := e.jobRow(r.ID)
			require.Equal(t, "failed", st)
			require.Equal(t, 2, attempts)
			require.Contains(t, le, "handler ended the claim transaction")
			checkEventsMatchJobs(t, e.pool, e.schema)
		})
	}
}

// A leased handler's COMMIT that fails (a deferred constraint) records the
// failure with its cause at once; the job stayed running until its lease
// expired, recorded as a lease expiry.
func TestLeasedCommitFailureIsRecorded(t *testing.T) {
	t.Parallel()
	var schema string
	e := newEnv(t, queue.Config{
		Queues:        map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Backoff:       fastBackoff,
		LeasedKinds:   []string{"w"},
		LeaseDuration: 30 * time.Second,
		Handlers: map[string]queue.Handler{"w": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+schema+`.deferred (k) VALUES (1)`)
			return err
		})},
	})
	schema = e.schema
	ctx := context.Background()
	_, err := e.pool.Exec(ctx, `CREATE TABLE `+e.table("deferred")+` (k int UNIQUE DEFERRABLE INITIALLY DEFERRED); INSERT INTO `+e.table("deferred")+` VALUES (1)`)
	require.NoError(t, err)
	r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "w", MaxAttempts: 2})
	require.NoError(t, err)
	e.run()
	waitFor(t, 20*time.Second, "failed", func() bool { return e.count(`id = $1 AND state = 'failed'`, r.ID) == 1 })
	_, attempts, le := e.jobRow(r.ID)
	require.Equal(t, 2, attempts)
	require.Contains(t, le, "commit failed")
	require.Empty(t, e.effectCounts())
	checkEventsMatchJobs(t, e.pool, e.schema)
}
