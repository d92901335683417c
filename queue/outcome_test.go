package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// runs records when each attempt of each job started.
type runs struct {
	mu sync.Mutex
	at map[int64][]time.Time
}

func (r *runs) add(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = map[int64][]time.Time{}
	}
	r.at[id] = append(r.at[id], time.Now())
	return len(r.at[id])
}

func (r *runs) of(id int64) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.at[id]...)
}

// outcomeEnv runs handler for kind "k", held or leased, with an hour of
// backoff (so only an explicit outcome can make a retry come soon).
func outcomeEnv(t *testing.T, leased bool, policies map[string]queue.RetryPolicy, h func(ctx context.Context, tx pgx.Tx, j *queue.Job) error) *env {
	cfg := queue.Config{
		Queues:        map[string]queue.QueueConfig{"default": {}},
		Backoff:       func(int) time.Duration { return time.Hour },
		RetryPolicies: policies,
		Handlers:      map[string]queue.Handler{"k": queue.HandlerFunc(h)},
	}
	if leased {
		cfg.LeasedKinds = []string{"k"}
	}
	e := newEnv(t, cfg)
	e.signals = queue.EnableTestSignals(e.c)
	e.run()
	return e
}

// The handler outcome controls, in both execution modes: Snooze runs the job
// again after its delay without counting the attempt, Cancel ends it
// cancelled at once, RetryAfter replaces the backoff, and a kind's
// RetryPolicy sees the job and its error and can end the retries.
func TestHandlerOutcomeControls(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name   string
		leased bool
	}{{"held", false}, {"leased", true}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			t.Run("Snooze", func(t *testing.T) {
				t.Parallel()
				var r runs
				var schema string
				e := outcomeEnv(t, mode.leased, nil, func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					if err := effect(ctx, tx, schema, j); err != nil {
						return err
					}
					if r.add(j.ID) == 1 {
						require.Equal(t, 1, j.Attempt)
						return queue.Snooze(300 * time.Millisecond)
					}
					require.Equal(t, 1, j.Attempt, "the snoozed attempt was not counted")
					return nil
				})
				schema = e.schema
				res, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k"})
				require.NoError(t, err)
				waitFor(t, 20*time.Second, "done", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, res.ID) == 1 })
				at := r.of(res.ID)
				require.Len(t, at, 2)
				require.GreaterOrEqual(t, at[1].Sub(at[0]), 300*time.Millisecond)
				require.Equal(t, 1, e.count(`id = $1 AND attempts = 1 AND last_error IS NULL`, res.ID))
				require.Equal(t, 1, e.effectCounts()[res.ID], "the snoozed attempt's writes rolled back")
				want := []queue.EventType{queue.EventEnqueued, queue.EventSnoozed, queue.EventSucceeded}
				if mode.leased {
					want = []queue.EventType{queue.EventEnqueued, queue.EventStarted, queue.EventSnoozed, queue.EventStarted, queue.EventSucceeded}
				}
				require.Equal(t, want, e.eventTypes(res.ID))
				require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM `+e.table("events")+` WHERE job_id = $1 AND type = 'snoozed'
					AND attempt = 0 AND (data->>'run_after')::timestamptz > at`, res.ID))
				require.Equal(t, 1.0, e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "snoozed"}))
				checkEventsMatchJobs(t, e.pool, e.schema)
			})
			t.Run("Cancel", func(t *testing.T) {
				t.Parallel()
				var r runs
				e := outcomeEnv(t, mode.leased, nil, func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					r.add(j.ID)
					return queue.Cancel(errors.New("customer deleted"))
				})
				res, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", MaxAttempts: 5})
				require.NoError(t, err)
				waitFor(t, 20*time.Second, "cancelled", func() bool { return e.count(`id = $1 AND state = 'cancelled'`, res.ID) == 1 })
				require.Equal(t, 1, e.count(`id = $1 AND attempts = 1 AND finished_at IS NOT NULL AND last_error LIKE '%customer deleted%'`, res.ID))
				// The dispatcher looked again after the cancel committed
				// and claimed nothing more.
				require.Equal(t, 1, e.signals.LookAgain(t, "default"), "not retried")
				require.Len(t, r.of(res.ID), 1, "not retried")
				want := []queue.EventType{queue.EventEnqueued, queue.EventCancelled}
				if mode.leased {
					want = []queue.EventType{queue.EventEnqueued, queue.EventStarted, queue.EventCancelled}
				}
				require.Equal(t, want, e.eventTypes(res.ID))
				waitFor(t, 10*time.Second, "outcome counted", func() bool {
					return e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "cancelled"}) == 1
				})
				checkEventsMatchJobs(t, e.pool, e.schema)
			})
			t.Run("RetryAfter", func(t *testing.T) {
				t.Parallel()
				var r runs
				e := outcomeEnv(t, mode.leased, nil, func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					if r.add(j.ID) == 1 {
						return queue.RetryAfter(200*time.Millisecond, errors.New("rate limited"))
					}
					return nil
				})
				res, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k"})
				require.NoError(t, err)
				waitFor(t, 20*time.Second, "done", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, res.ID) == 1 })
				at := r.of(res.ID)
				require.Len(t, at, 2)
				require.GreaterOrEqual(t, at[1].Sub(at[0]), 200*time.Millisecond)
				require.Equal(t, 1, e.count(`id = $1 AND attempts = 2 AND last_error = 'rate limited'`, res.ID))
				checkEventsMatchJobs(t, e.pool, e.schema)
			})
			t.Run("RetryAfterOnTheLastAttempt", func(t *testing.T) {
				t.Parallel()
				e := outcomeEnv(t, mode.leased, nil, func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					return queue.RetryAfter(time.Millisecond, errors.New("still down"))
				})
				res, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", MaxAttempts: 1})
				require.NoError(t, err)
				waitFor(t, 20*time.Second, "failed", func() bool { return e.count(`id = $1 AND state = 'failed' AND attempts = 1`, res.ID) == 1 })
			})
			t.Run("RetryPolicy", func(t *testing.T) {
				t.Parallel()
				permanent := errors.New("permanent")
				var seen sync.Map
				policy := func(j *queue.Job, err error) time.Duration {
					seen.Store(j.ID, err.Error())
					if errors.Is(err, permanent) {
						return -1
					}
					return 50 * time.Millisecond
				}
				e := outcomeEnv(t, mode.leased, map[string]queue.RetryPolicy{"k": policy}, func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
					var p struct{ Permanent bool }
					if err := json.Unmarshal(j.Payload, &p); err != nil {
						return err
					}
					if p.Permanent {
						return permanent
					}
					if j.Attempt == 1 {
						return errors.New("flaky")
					}
					return nil
				})
				perm, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", MaxAttempts: 5, Payload: map[string]bool{"Permanent": true}})
				require.NoError(t, err)
				flaky, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", MaxAttempts: 5})
				require.NoError(t, err)
				waitFor(t, 20*time.Second, "both ended", func() bool {
					return e.count(`(id = $1 AND state = 'failed' AND attempts = 1) OR (id = $2 AND state = 'succeeded' AND attempts = 2)`, perm.ID, flaky.ID) == 2
				})
				v, _ := seen.Load(perm.ID)
				require.Equal(t, "permanent", v)
				v, _ = seen.Load(flaky.ID)
				require.Equal(t, "flaky", v)
				checkEventsMatchJobs(t, e.pool, e.schema)
			})
		})
	}
}

// A RetryPolicy for a kind with no handler is refused by New.
func TestRetryPolicyNeedsAHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	_, err := queue.New(e.pool, queue.Config{Schema: e.schema,
		RetryPolicies: map[string]queue.RetryPolicy{"nope": func(*queue.Job, error) time.Duration { return 0 }}})
	require.ErrorIs(t, err, queue.ErrInvalidConfig)
}

// Cancel from another client reaches a held-mode job whose handler runs:
// the handler's context ends at once, its writes roll back, and the job ends
// cancelled with its attempt counted and no retry.
func TestCancelRunningHeldJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	running := make(chan struct{}, 1)
	ended := make(chan time.Time, 1)
	var schema string
	e := newEnv(t, queue.Config{
		Queues:  map[string]queue.QueueConfig{"default": {}},
		Backoff: fastBackoff,
		Handlers: map[string]queue.Handler{"long": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			running <- struct{}{}
			<-ctx.Done()
			ended <- time.Now()
			return ctx.Err() // what a handler usually returns
		})},
	})
	schema = e.schema
	signals := queue.EnableTestSignals(e.c)
	e.run()
	signals.WaitListening(t)
	other := newEnvOn(t, e.pool, e.schema, queue.Config{}) // another process's client
	res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "long", MaxAttempts: 5})
	require.NoError(t, err)
	<-running
	asked := time.Now()
	require.NoError(t, other.c.Cancel(ctx, res.ID))
	returned := time.Since(asked)
	select {
	case at := <-ended:
		t.Logf("handler cancelled %s after Cancel was called; Cancel returned after %s", at.Sub(asked), returned)
		require.Less(t, at.Sub(asked), time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("the running handler was not cancelled")
	}
	require.Equal(t, 1, e.count(`id = $1 AND state = 'cancelled' AND attempts = 1 AND last_error LIKE '%Client.Cancel%'`, res.ID))
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventCancelled}, e.eventTypes(res.ID))
	require.Zero(t, e.effectCounts()[res.ID], "the handler's writes rolled back")
	// Counted once the worker's commit returned, which may be after Cancel's.
	waitFor(t, 10*time.Second, "outcome counted", func() bool {
		return e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "cancelled"}) == 1
	})
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// A worker that does not get Cancel's notification (its LISTEN connection is
// down) finishes the running attempt first: Cancel waits for it, and a job
// that succeeded meanwhile stays succeeded.
func TestCancelWaitsForAWorkerThatMissesTheNotification(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	running := make(chan struct{}, 1)
	const work = 300 * time.Millisecond
	e := newEnv(t, queue.Config{})
	cc := e.pool.Config().ConnConfig.Copy()
	cc.Port = 1        // nothing listens there: no notification reaches this worker
	cc.Fallbacks = nil // sslmode=prefer (a URL without sslmode) adds one on the real port
	cc.ConnectTimeout = 100 * time.Millisecond
	worker := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues:             map[string]queue.QueueConfig{"default": {}},
		PollInterval:       100 * time.Millisecond,
		ListenerConnConfig: cc,
		Handlers: map[string]queue.Handler{"long": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			running <- struct{}{}
			select {
			case <-time.After(work):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})},
	})
	worker.run()
	res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "long"})
	require.NoError(t, err)
	<-running
	asked := time.Now()
	err = e.c.Cancel(ctx, res.ID)
	require.ErrorIs(t, err, queue.ErrNotFound, "the attempt ended first, and succeeded")
	require.GreaterOrEqual(t, time.Since(asked), work/2, "Cancel waited for the attempt")
	require.Equal(t, 1, e.count(`id = $1 AND state = 'succeeded' AND attempts = 1`, res.ID))
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventSucceeded}, e.eventTypes(res.ID))
}

// Notifications are hints: a worker that gets none (its LISTEN connection
// cannot connect) finds every job at its next poll, each within about one
// PollInterval of its commit, and counts those claims as source="poll"
// (docs/semantics.md, "Notifications are hints").
func TestLostNotificationsCostAtMostAPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const poll = 200 * time.Millisecond
	started := make(chan time.Time, 10)
	e := newEnv(t, queue.Config{})
	cc := e.pool.Config().ConnConfig.Copy()
	cc.Port = 1        // nothing listens there: no notification reaches this worker
	cc.Fallbacks = nil // sslmode=prefer (a URL without sslmode) adds one on the real port
	cc.ConnectTimeout = 100 * time.Millisecond
	worker := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues:             map[string]queue.QueueConfig{"default": {}},
		PollInterval:       poll,
		ListenerConnConfig: cc,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			started <- time.Now()
			return nil
		})},
	})
	worker.run()
	time.Sleep(2 * poll) // the worker is idle, sleeping its poll
	var waits []time.Duration
	for i := range 5 {
		time.Sleep(poll/3 + time.Duration(i)*poll/7) // at varied points of the poll's cycle
		res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
		require.NoError(t, err)
		committed := time.Now()
		select {
		case at := <-started:
			waits = append(waits, at.Sub(committed))
		case <-time.After(30 * time.Second):
			t.Fatalf("job %d not run", res.ID)
		}
	}
	t.Logf("waits from commit to start, poll %s: %v", poll, waits)
	for _, w := range waits {
		// One poll interval, plus a second for a loaded machine.
		require.Less(t, w, poll+time.Second)
	}
	require.GreaterOrEqual(t, worker.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}), 1.0,
		"claims found by the poll are counted as such")
}
