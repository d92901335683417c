package queue_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// nilFieldErr reads a field in Error: a nil *nilFieldErr returned as an
// error (the typed-nil mistake) panics when its message is taken.
type nilFieldErr struct{ msg string }

func (e *nilFieldErr) Error() string { return "failed: " + e.msg }

func typedNil() *nilFieldErr { return nil }

// jobRow is a job's state, attempts and last error.
func (e *env) jobRow(id int64) (state string, attempts int, lastErr string) {
	e.t.Helper()
	var le *string
	require.NoError(e.t, e.pool.QueryRow(context.Background(),
		`SELECT state, attempts, last_error FROM `+e.table("jobs")+` WHERE id = $1`, id).Scan(&state, &attempts, &le))
	if le != nil {
		lastErr = *le
	}
	return state, attempts, lastErr
}

// User code the worker calls on its own goroutines cannot take the process
// down: a handler's typed-nil error whose Error method panics, a
// RetryPolicy that panics and a Config.Backoff that panics each fail the
// attempt as recorded (the policy's and backoff's panics fall back to
// DefaultBackoff), in both modes. Before, each panicked on the worker's
// goroutine outside the handler's recover and ended the process.
func TestHandlerErrorsThatPanic(t *testing.T) {
	t.Parallel()
	for _, leased := range []bool{false, true} {
		t.Run(map[bool]string{false: "held", true: "leased"}[leased], func(t *testing.T) {
			t.Parallel()
			fail := queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return errors.New("boom") })
			cfg := queue.Config{
				Queues: map[string]queue.QueueConfig{"default": {}},
				Handlers: map[string]queue.Handler{
					"typed-nil": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
						var err error = typedNil()
						return err
					}),
					"policy":  fail,
					"backoff": fail,
					"hook":    queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil }),
				},
				Hooks: queue.Hooks{Work: func(ctx context.Context, j *queue.Job) (context.Context, func(error)) {
					if j.Kind == "hook" {
						panic("work hook bug")
					}
					return ctx, nil
				}},
				RetryPolicies: map[string]queue.RetryPolicy{"policy": func(*queue.Job, error) time.Duration {
					var m map[string]int
					m["x"]++ // panics: a nil map
					return time.Second
				}},
				Backoff: func(int) time.Duration { panic("backoff bug") },
			}
			if leased {
				cfg.LeasedKinds = []string{"typed-nil", "policy", "backoff", "hook"}
			}
			e := newEnv(t, cfg)
			ctx := context.Background()
			ids := e.enqueueIDs(queue.NewJob{Kind: "typed-nil"}, queue.NewJob{Kind: "policy"}, queue.NewJob{Kind: "backoff"},
				queue.NewJob{Kind: "hook"})
			e.run()
			waitFor(t, 15*time.Second, "every attempt recorded", func() bool {
				return e.count(`id = ANY($1) AND attempts = 1 AND state = 'pending'`, ids) == 4
			})
			_, _, hookErr := e.jobRow(ids[3])
			require.Contains(t, hookErr, "work hook bug", "the Work hook's panic failed the attempt")
			_, _, le := e.jobRow(ids[0])
			require.Contains(t, le, "Error method panics", "the typed nil's failure says what happened")
			// Both fall back to DefaultBackoff: 30 s for the first retry.
			require.Equal(t, 2, e.count(`id = ANY($1) AND run_after > now() + interval '20 seconds'`, ids[1:3]))
			_ = ctx
		})
	}
}

// A handler that changes the *Job it was given (json.Unmarshal of a payload
// with an "id" field into it, a reused struct) changes its own copy only:
// the job pgwake claimed is the one recorded, with its own attempt count.
// Before, a changed ID marked another job (pending, not due) succeeded
// without running it, and a reset Attempt retried for ever.
func TestHandlerChangesItsJob(t *testing.T) {
	t.Parallel()
	var victim atomic.Int64
	var runs atomic.Int32
	e := newEnv(t, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {}},
		Handlers: map[string]queue.Handler{
			"steal": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
				j.ID, j.Attempt, j.MaxAttempts = victim.Load(), 0, 100
				return nil
			}),
			"reset": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
				runs.Add(1)
				j.ID, j.Attempt, j.MaxAttempts = victim.Load(), 0, 100
				return errors.New("fails")
			}),
		},
		RetryPolicies: map[string]queue.RetryPolicy{"reset": func(*queue.Job, error) time.Duration { return 10 * time.Millisecond }},
	})
	ids := e.enqueueIDs(queue.NewJob{Kind: "victim", Delay: time.Hour})
	victim.Store(ids[0])
	ids = append(ids, e.enqueueIDs(queue.NewJob{Kind: "steal"}, queue.NewJob{Kind: "reset", MaxAttempts: 3})...)
	e.run()
	waitFor(t, 15*time.Second, "both jobs finished", func() bool {
		return e.count(`id = $1 AND state = 'succeeded'`, ids[1]) == 1 && e.count(`id = $1 AND state = 'failed'`, ids[2]) == 1
	})
	state, attempts, _ := e.jobRow(ids[0])
	require.Equal(t, "pending", state, "the job whose id a handler wrote is untouched")
	require.Equal(t, 0, attempts)
	_, attempts, _ = e.jobRow(ids[2])
	require.Equal(t, 3, attempts, "MaxAttempts as enqueued, whatever the handler wrote")
	require.Equal(t, int32(3), runs.Load())
}

// A handler that ends its goroutine (runtime.Goexit; t.FailNow or a
// require in a handler under test) loses its attempt like a worker that
// died: the claim transaction rolls back, its connection goes back to the
// pool, and the job runs again. Before, the connection and the job's row
// lock were held until the process ended, and Stop's cleanup hung.
func TestHandlerGoexit(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	e := newEnvOwnPool(t, 8, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			if runs.Add(1) == 1 {
				runtime.Goexit()
			}
			return nil
		})},
	})
	ids := e.enqueueIDs(queue.NewJob{Kind: "k"})
	e.run()
	waitFor(t, 30*time.Second, "the job ran again and succeeded", func() bool {
		return e.count(`id = $1 AND state = 'succeeded'`, ids[0]) == 1
	})
	require.Equal(t, int32(2), runs.Load())
	_, attempts, _ := e.jobRow(ids[0])
	require.Equal(t, 1, attempts, "a lost attempt is not charged on its first loss (attempts.go)")
	waitFor(t, 5*time.Second, "no connection kept", func() bool {
		return e.pool.Stat().AcquiredConns() == 0
	})
}

// KindTimeouts[k] = 0 means JobTimeout (as River's Worker.Timeout), not "no
// timeout": before, the handler ran unbounded while its claim transaction
// kept the pool's idle-in-transaction timeout, which could end it.
func TestKindTimeoutZeroIsTheDefault(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		JobTimeout:   200 * time.Millisecond,
		KindTimeouts: map[string]time.Duration{"k": 0},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, _ *queue.Job) error {
			<-ctx.Done()
			return ctx.Err()
		})},
	})
	ids := e.enqueueIDs(queue.NewJob{Kind: "k", MaxAttempts: 1})
	e.run()
	waitFor(t, 10*time.Second, "the attempt timed out", func() bool {
		return e.count(`id = $1 AND state = 'failed'`, ids[0]) == 1
	})
	_, _, le := e.jobRow(ids[0])
	require.Contains(t, le, "job timed out after 200ms")
}

// Stop called while Start is still starting waits for it and stops what it
// started; before, it returned ErrNotStarted and the client ran on.
func TestStopDuringStart(t *testing.T) {
	t.Parallel()
	var ran atomic.Int32
	e := newEnvOwnPool(t, 4, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 1}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	ctx := context.Background()
	// Hold every connection: Start's schema check waits for one.
	var held []*pgxpool.Conn
	release := sync.OnceFunc(func() {
		for _, c := range held {
			c.Release()
		}
	})
	t.Cleanup(release) // also when the test fails below
	for range 4 {
		c, err := e.pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, c)
	}
	started := make(chan error, 1)
	go func() { started <- e.c.Start(ctx) }()
	// Stop is called once Start has begun, which takes the goroutine's
	// first steps; a fixed sleep here let a busy machine call Stop before
	// Start, which rightly returned ErrNotStarted.
	waitFor(t, 30*time.Second, "Start begun", func() bool { return queue.Starting(e.c) })
	select {
	case err := <-started:
		t.Fatalf("Start returned %v while every connection was held", err)
	default: // Start is waiting for a connection
	}
	stopped := make(chan error, 1)
	go func() { stopped <- e.c.Stop(ctx) }()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned %v while Start was still starting", err)
	case <-time.After(200 * time.Millisecond):
	}
	release()
	require.NoError(t, <-started)
	require.NoError(t, <-stopped, "Stop stopped what Start started")
	e.enqueueIDs(queue.NewJob{Kind: "k"})
	time.Sleep(500 * time.Millisecond) // a running client takes a job in milliseconds
	require.Zero(t, ran.Load(), "the client is stopped")
	require.ErrorIs(t, e.c.Stop(ctx), queue.ErrNotStarted)
}
