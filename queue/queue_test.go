package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
)

func TestEnqueueTxRollbackLeavesNothingCommitWakesWorker(t *testing.T) {
	t.Parallel()
	ran := make(chan int64, 10)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute, // only a notification can wake the worker in time
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return nil
		})},
	})
	ctx := context.Background()

	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // the schema's drop waits for it
	_, err = e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, e.count(`true`))
	require.Equal(t, 0, e.countSQL(`SELECT count(*) FROM `+e.table("events")))

	signals := queue.EnableTestSignals(e.c)
	e.run()
	// Wait until the worker listens, has looked after that and gone to
	// sleep, idle-marked.
	signals.WaitListening(t)
	require.Zero(t, signals.LookAgain(t, "default"))
	tx, err = e.pool.Begin(ctx)
	require.NoError(t, err)
	res, err := e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	// A look while the transaction is open does not see the job.
	require.Zero(t, signals.LookAgain(t, "default"), "claimed a job before its transaction committed")
	select {
	case <-ran:
		t.Fatal("job ran before its transaction committed")
	default:
	}
	require.NoError(t, tx.Commit(ctx))
	select {
	case id := <-ran:
		require.Equal(t, res.ID, id)
	case <-time.After(20 * time.Second): // far below the 1m poll interval
		t.Fatal("committed job did not run")
	}
	waitFor(t, 10*time.Second, "job succeeded", func() bool { return e.count(`state = 'succeeded'`) == 1 })
	require.Zero(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
	checkEventsMatchJobs(t, e.pool, e.schema)
}

func TestNotifyWakesWithinPollInterval(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}, "other": {}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	e.run()
	ctx := context.Background()
	for i := range 20 {
		q := "default"
		if i%2 == 1 {
			q = "other"
		}
		_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Queue: q})
		require.NoError(t, err)
		want := int64(i + 1)
		start := time.Now()
		waitFor(t, 30*time.Second, "job to run", func() bool { return ran.Load() == want })
		// Well under the one-minute poll: a notification woke the worker.
		require.Less(t, time.Since(start), 30*time.Second)
	}
	require.Zero(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
	require.GreaterOrEqual(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "notify"}), 1.0)
}

func TestListenerBackendTerminatedIsSurvived(t *testing.T) {
	t.Parallel()
	var ran atomic.Int64
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	// Our own listener with its own session name, so we can find its backend.
	appName := "pgwake_test_" + e.schema
	l, err := notify.New(notify.Config{ConnConfig: e.pool.Config().ConnConfig, Registerer: e.reg,
		MinBackoff: 10 * time.Millisecond, ApplicationName: appName})
	require.NoError(t, err)
	e2 := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {}}, PollInterval: time.Minute, Listener: l,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran.Add(1)
			return nil
		})},
	})
	lctx, lcancel := context.WithCancel(context.Background())
	ldone := make(chan struct{})
	go func() { _ = l.Run(lctx); close(ldone) }()
	t.Cleanup(func() { lcancel(); <-ldone })
	e2.run()
	ctx := context.Background()

	for round := 1; round <= 3; round++ {
		waitFor(t, 10*time.Second, "listener connected", l.Connected)
		var n int
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, appName).Scan(&n))
		require.Equal(t, 1, n, "one listener backend")
		waitFor(t, 10*time.Second, "listener reconnect", func() bool {
			return e.metric("pgwake_notify_reconnects_total", nil) >= float64(round) && l.Connected()
		})
		_, err := e2.c.Enqueue(ctx, queue.NewJob{Kind: "k"})
		require.NoError(t, err)
		want := int64(round)
		waitFor(t, 30*time.Second, "job after reconnect", func() bool { return ran.Load() == want })
	}
	require.Zero(t, e2.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
}

func TestDelayedJobRunsOnTimeNotBefore(t *testing.T) {
	t.Parallel()
	type start struct {
		id  int64
		at  time.Time
		due time.Time
	}
	ran := make(chan start, 10)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			var now time.Time
			if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
				return err
			}
			ran <- start{j.ID, now, j.RunAfter}
			return nil
		})},
	})
	signals := queue.EnableTestSignals(e.c)
	e.run()
	ctx := context.Background()
	signals.WaitListening(t)
	// A far job first: the worker's timer is set to it.
	far, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Delay: time.Hour})
	require.NoError(t, err)
	// A nearer job must shorten that timer.
	near, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Delay: 1500 * time.Millisecond})
	require.NoError(t, err)
	select {
	case s := <-ran:
		require.Equal(t, near.ID, s.id)
		require.False(t, s.at.Before(s.due), "ran at %s, before run_after %s", s.at, s.due)
		// Promptly: long before the one-minute poll.
		require.Less(t, s.at.Sub(s.due), 20*time.Second)
	case <-time.After(40 * time.Second):
		t.Fatal("delayed job did not run")
	}
	require.Equal(t, 1, e.count(`id = $1 AND state = 'pending'`, far.ID))
	// Run-after in the past runs at once; explicit RunAfter is honoured.
	past, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", RunAfter: time.Now().Add(-1000 * time.Hour)})
	require.NoError(t, err)
	select {
	case s := <-ran:
		require.Equal(t, past.ID, s.id)
	case <-time.After(40 * time.Second):
		t.Fatal("job with run_after in the past did not run")
	}
}

func TestRetriesWithBackoffThenFailed(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var schema string
	var attempts []int
	var mu sync.Mutex
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Backoff:      func(attempt int) time.Duration { return time.Duration(attempt) * 100 * time.Millisecond },
		Handlers: map[string]queue.Handler{"boom": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			mu.Lock()
			attempts = append(attempts, j.Attempt)
			mu.Unlock()
			calls.Add(1)
			// Writes of a failed attempt must roll back.
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			return errors.New("boom " + strings.Repeat("x", 10000))
		})},
		MaxErrorBytes: 200,
	})
	schema = e.schema
	e.run()
	ctx := context.Background()
	res, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "boom", MaxAttempts: 3})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "job failed", func() bool { return e.count(`state = 'failed'`) == 1 })
	require.Equal(t, int64(3), calls.Load())
	require.Equal(t, []int{1, 2, 3}, attempts)

	var st, lastErr string
	var n int
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT state, attempts, last_error FROM `+e.table("jobs")+` WHERE id = $1`, res.ID).Scan(&st, &n, &lastErr))
	require.Equal(t, "failed", st)
	require.Equal(t, 3, n)
	require.LessOrEqual(t, len(lastErr), 200)
	require.True(t, strings.HasPrefix(lastErr, "boom xxx"), lastErr)
	require.True(t, strings.HasSuffix(lastErr, "[truncated]"), lastErr)
	require.Empty(t, e.effectCounts(), "writes of failed attempts must roll back")

	// Events: enqueued, retry_scheduled x2 with run_after = at + backoff, failed.
	rows, err := e.pool.Query(ctx, `SELECT type, attempt, extract(epoch FROM (data->>'run_after')::timestamptz - at) FROM `+e.table("events")+` WHERE job_id = $1 ORDER BY id`, res.ID)
	require.NoError(t, err)
	var types []queue.EventType
	for rows.Next() {
		var typ queue.EventType
		var att int
		var gap *float64
		require.NoError(t, rows.Scan(&typ, &att, &gap))
		types = append(types, typ)
		if typ == queue.EventRetryScheduled {
			require.NotNil(t, gap)
			want := float64(att) * 0.1
			require.InDelta(t, want, *gap, 0.05, "backoff after attempt %d", att)
		}
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventRetryScheduled, queue.EventRetryScheduled, queue.EventFailed}, types)
	require.Equal(t, 2.0, e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "retry"}))
	require.Equal(t, 1.0, e.metric("pgwake_worker_jobs_total", map[string]string{"outcome": "failed"}))
	checkEventsMatchJobs(t, e.pool, e.schema)

	// Retry puts it back; it runs once more and fails again.
	require.NoError(t, e.c.Retry(ctx, res.ID))
	waitFor(t, 30*time.Second, "retried job ran", func() bool { return calls.Load() == 4 })
	waitFor(t, 30*time.Second, "job failed again", func() bool { return e.count(`state = 'failed' AND attempts = 4`) == 1 })
	require.ErrorIs(t, e.c.Cancel(ctx, res.ID), queue.ErrNotFound)
	checkEventsMatchJobs(t, e.pool, e.schema)
}

func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute}
	for i, w := range want {
		require.Equal(t, w, queue.DefaultBackoff(i+1))
	}
	require.Equal(t, 24*time.Hour, queue.DefaultBackoff(100))
	require.Equal(t, 30*time.Second, queue.DefaultBackoff(0))
}

func TestPanicTimeoutAndUnknownKindFailTheAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Backoff:      func(int) time.Duration { return time.Hour },
		KindTimeouts: map[string]time.Duration{"slow": 200 * time.Millisecond},
		Logger:       zaptest.NewLogger(t),
		Handlers: map[string]queue.Handler{
			"panic": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				var m map[string]int
				m["x"] = 1 // nil map write
				return nil
			}),
			"slow": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
				_, err := tx.Exec(ctx, `SELECT pg_sleep(30)`)
				return err
			}),
			"ok": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error { return nil }),
		},
	})
	e.run()
	ctx := context.Background()
	ids := map[string]int64{}
	for _, k := range []string{"panic", "slow", "nobody"} {
		r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: k})
		require.NoError(t, err)
		ids[k] = r.ID
	}
	waitFor(t, 30*time.Second, "three failed attempts", func() bool { return e.count(`attempts = 1 AND state = 'pending'`) == 3 })
	lastErr := func(id int64) string {
		var s string
		require.NoError(t, e.pool.QueryRow(ctx, `SELECT last_error FROM `+e.table("jobs")+` WHERE id = $1`, id).Scan(&s))
		return s
	}
	require.Contains(t, lastErr(ids["panic"]), "handler panicked: assignment to entry in nil map")
	require.Contains(t, lastErr(ids["panic"]), "goroutine ", "stack in the error")
	require.Contains(t, lastErr(ids["slow"]), "job timed out after 200ms")
	require.Equal(t, `no handler registered for kind "nobody"`, lastErr(ids["nobody"]))
	// The worker survived all three: it still runs jobs.
	r, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "ok job", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, r.ID) == 1 })
	checkEventsMatchJobs(t, e.pool, e.schema)
}

func TestHandlerWritesCommitWithCompletion(t *testing.T) {
	t.Parallel()
	var schema string
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Backoff:      func(int) time.Duration { return time.Millisecond },
		Handlers: map[string]queue.Handler{"w": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			if tx.Commit(ctx) == nil || tx.Rollback(ctx) == nil {
				return errors.New("handler could end the claim transaction")
			}
			if j.Attempt == 1 {
				return errors.New("first attempt fails after writing")
			}
			return nil
		})},
	})
	schema = e.schema
	e.run()
	r, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "w"})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "job succeeded", func() bool { return e.count(`state = 'succeeded'`) == 1 })
	// Exactly one effect: attempt 2's. Attempt 1's write rolled back.
	require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM `+e.table("effects")+` WHERE job_id = $1 AND attempt = 2`, r.ID))
	e.requireExactlyOnce([]int64{r.ID})
}

func TestUniqueKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	a, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", UniqueKey: "u1"})
	require.NoError(t, err)
	require.False(t, a.Duplicate)
	b, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", UniqueKey: "u1", Payload: map[string]int{"x": 1}})
	require.NoError(t, err)
	require.True(t, b.Duplicate)
	require.Equal(t, a.ID, b.ID)
	require.Equal(t, 1, e.count(`true`))
	require.Equal(t, 1, e.countSQL(`SELECT count(*) FROM `+e.table("events")))

	// In a batch: duplicates of each other and of the existing job.
	res, err := e.c.EnqueueMany(ctx, []queue.NewJob{
		{Kind: "k", UniqueKey: "u2"}, {Kind: "k"}, {Kind: "k", UniqueKey: "u1"}, {Kind: "k", UniqueKey: "u2"}, {Kind: "k"},
	})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.False(t, res[1].Duplicate)
	require.True(t, res[2].Duplicate)
	require.Equal(t, a.ID, res[2].ID)
	require.True(t, res[3].Duplicate)
	require.Equal(t, res[0].ID, res[3].ID)
	require.False(t, res[4].Duplicate)
	require.Equal(t, 4, e.count(`true`))

	// Once finished, the key is free again.
	require.NoError(t, e.c.Cancel(ctx, a.ID))
	c, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", UniqueKey: "u1"})
	require.NoError(t, err)
	require.False(t, c.Duplicate)
	require.NotEqual(t, a.ID, c.ID)
	checkEventsMatchJobs(t, e.pool, e.schema)
}

func TestEnqueueManyOneNotifyPerQueueOnlyWhenAWorkerWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, e.pool.Config().ConnConfig)
	require.NoError(t, err)
	defer conn.Close(ctx)
	ch := queue.WakeChannel(e.schema)
	_, err = conn.Exec(ctx, `LISTEN `+pgx.Identifier{ch}.Sanitize())
	require.NoError(t, err)

	jobs := make([]queue.NewJob, 0, 300)
	for i := range 300 {
		q := []string{"a", "b", "c"}[i%3]
		j := queue.NewJob{Kind: "k", Queue: q}
		if q == "c" {
			j.Delay = time.Hour
		}
		jobs = append(jobs, j)
	}
	// Notifications up to a marker sent after the batch (they arrive in
	// commit order).
	received := func() []string {
		_, err := e.pool.Exec(ctx, `SELECT pg_notify($1, 'marker')`, ch)
		require.NoError(t, err)
		var got []string
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			require.NoError(t, err)
			if n.Payload == "marker" {
				return got
			}
			got = append(got, n.Payload)
		}
	}

	// No worker is waiting: no NOTIFY at all (it would only slow commits).
	_, err = e.c.EnqueueMany(ctx, jobs[:30])
	require.NoError(t, err)
	require.Empty(t, received())

	// Workers asleep on a, b and c: one NOTIFY per queue per batch.
	w := newEnvOn(t, e.pool, e.schema, queue.Config{
		Queues:       map[string]queue.QueueConfig{"a": {}, "b": {}, "c": {}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return nil
		})},
	})
	w.run()
	waitFor(t, 20*time.Second, "workers asleep", func() bool {
		return e.countSQL(`SELECT count(*) FROM `+e.table("waiters")+` WHERE idle`) == 3
	})
	res, err := e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	require.Len(t, res, 300)
	seen := map[int64]bool{}
	for _, r := range res {
		require.False(t, seen[r.ID])
		seen[r.ID] = true
	}
	got := received()
	require.Len(t, got, 3, "one notification per queue: %v", got)
	byQueue := map[string]string{}
	for _, p := range got {
		q, rest, _ := strings.Cut(p, "|")
		byQueue[q] = rest
	}
	require.Equal(t, "", byQueue["a"])
	require.Equal(t, "", byQueue["b"])
	require.NotEmpty(t, byQueue["c"], "delayed queue's wake-up carries the delay")
	require.Equal(t, 330, e.count(`true`))
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// Producers skip NOTIFY unless a worker sleeps; the sleep protocol must never
// strand a job until the poll: every job here runs with a one-hour poll.
func TestNoLostWakeUpsUnderConcurrentProducers(t *testing.T) {
	t.Parallel()
	var schema string
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		PollInterval: time.Hour,
		Handlers: map[string]queue.Handler{"effect": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return effect(ctx, tx, schema, j)
		})},
	})
	schema = e.schema
	e.run()
	ctx := context.Background()
	var mu sync.Mutex
	var ids []int64
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Go(func() {
			for i := range 150 {
				var r queue.EnqueueResult
				var err error
				if i%3 == 0 {
					// In a caller's transaction that stays open a little.
					tx, terr := e.pool.Begin(ctx)
					require.NoError(t, terr)
					r, err = e.c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "effect"})
					require.NoError(t, err)
					time.Sleep(time.Duration(p) * time.Millisecond)
					require.NoError(t, tx.Commit(ctx))
				} else {
					r, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "effect"})
					require.NoError(t, err)
				}
				mu.Lock()
				ids = append(ids, r.ID)
				mu.Unlock()
				if i%10 == 0 {
					time.Sleep(time.Duration(i%7) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, 60*time.Second, "all jobs done", func() bool { return e.count(`state = 'succeeded'`) == len(ids) })
	e.requireExactlyOnce(ids)
	require.Zero(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
}

func TestBadInputIsRejectedBeforeWriting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{MaxPayloadBytes: 1000})
	ctx := context.Background()
	cases := []struct {
		name  string
		job   queue.NewJob
		want  error
		field string
	}{
		{"empty kind", queue.NewJob{}, queue.ErrInvalidKind, "kind"},
		{"long kind", queue.NewJob{Kind: strings.Repeat("k", 256)}, queue.ErrInvalidKind, "kind"},
		{"kind with NUL", queue.NewJob{Kind: "a\x00b"}, queue.ErrInvalidKind, "kind"},
		{"kind with space", queue.NewJob{Kind: "a b"}, queue.ErrInvalidKind, "kind"},
		{"kind not UTF-8", queue.NewJob{Kind: "a\xffb"}, queue.ErrInvalidKind, "kind"},
		{"queue upper", queue.NewJob{Kind: "k", Queue: "Default"}, queue.ErrInvalidQueue, "queue"},
		{"queue quote", queue.NewJob{Kind: "k", Queue: `a"; DROP TABLE x;--`}, queue.ErrInvalidQueue, "queue"},
		{"queue long", queue.NewJob{Kind: "k", Queue: strings.Repeat("q", 64)}, queue.ErrInvalidQueue, "queue"},
		{"queue unicode", queue.NewJob{Kind: "k", Queue: "qué"}, queue.ErrInvalidQueue, "queue"},
		{"queue pipe", queue.NewJob{Kind: "k", Queue: "a|1"}, queue.ErrInvalidQueue, "queue"},
		{"payload not JSON", queue.NewJob{Kind: "k", Payload: []byte("{nope")}, queue.ErrInvalidPayload, "payload"},
		{"payload Go string", queue.NewJob{Kind: "k", Payload: "hello"}, queue.ErrInvalidPayload, "payload"},
		{"payload NUL", queue.NewJob{Kind: "k", Payload: []byte(`{"a":"\u0000"}`)}, queue.ErrInvalidPayload, "payload"},
		{"payload unmarshalable", queue.NewJob{Kind: "k", Payload: map[string]any{"f": func() {}}}, queue.ErrInvalidPayload, "payload"},
		{"payload lone surrogate", queue.NewJob{Kind: "k", Payload: []byte(`{"a":"\ud800"}`)}, queue.ErrInvalidPayload, "payload"},
		{"payload numeric overflow", queue.NewJob{Kind: "k", Payload: []byte(`{"a":1e1000000}`)}, queue.ErrInvalidPayload, "payload"},
		{"metadata NUL", queue.NewJob{Kind: "k", Metadata: map[string]string{"a": "x\x00y"}}, queue.ErrInvalidMetadata, "metadata"},
		{"metadata key NUL", queue.NewJob{Kind: "k", Metadata: map[string]string{"a\x00": "v"}}, queue.ErrInvalidMetadata, "metadata"},
		{"metadata not UTF-8", queue.NewJob{Kind: "k", Metadata: map[string]string{"a": "x\xffy"}}, queue.ErrInvalidMetadata, "metadata"},
		{"payload too large", queue.NewJob{Kind: "k", Payload: map[string]string{"x": strings.Repeat("x", 1000)}}, queue.ErrPayloadTooLarge, "payload"},
		{"max attempts negative", queue.NewJob{Kind: "k", MaxAttempts: -1}, queue.ErrInvalidMaxAttempts, "max_attempts"},
		{"priority", queue.NewJob{Kind: "k", Priority: 40000}, queue.ErrInvalidPriority, "priority"},
		{"negative delay", queue.NewJob{Kind: "k", Delay: -time.Second}, queue.ErrInvalidSchedule, "delay"},
		{"year 10000", queue.NewJob{Kind: "k", RunAfter: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, queue.ErrInvalidSchedule, "run_after"},
		{"year 0 in UTC", queue.NewJob{Kind: "k", RunAfter: time.Date(1, 1, 1, 0, 30, 0, 0, time.FixedZone("+01", 3600))}, queue.ErrInvalidSchedule, "run_after"},
		{"year 10000 in UTC", queue.NewJob{Kind: "k", RunAfter: time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("-01", -3600))}, queue.ErrInvalidSchedule, "run_after"},
		{"unique key NUL", queue.NewJob{Kind: "k", UniqueKey: "a\x00"}, queue.ErrInvalidUniqueKey, "unique_key"},
	}
	for _, tc := range cases {
		_, err := e.c.Enqueue(ctx, tc.job)
		require.ErrorIs(t, err, tc.want, tc.name)
		var je *queue.JobError
		require.ErrorAs(t, err, &je, tc.name)
		require.Equal(t, tc.field, je.Field, tc.name)
		// A batch with one bad job writes nothing at all.
		_, err = e.c.EnqueueMany(ctx, []queue.NewJob{{Kind: "good"}, tc.job})
		require.ErrorAs(t, err, &je, tc.name)
		require.Equal(t, 1, je.Index, tc.name)
	}
	require.Equal(t, 0, e.count(`true`))
	require.Equal(t, 0, e.countSQL(`SELECT count(*) FROM `+e.table("events")))

	// Bad configuration.
	for name, cfg := range map[string]queue.Config{
		"schema quote":                        {Schema: `pgwake"; drop`},
		"schema upper":                        {Schema: "Pgwake"},
		"schema long":                         {Schema: strings.Repeat("s", 41)},
		"bad queue":                           {Schema: "ok", Queues: map[string]queue.QueueConfig{"A": {}}},
		"workers":                             {Schema: "ok", Queues: map[string]queue.QueueConfig{"a": {MaxWorkers: -1}}},
		"nil handler":                         {Schema: "ok", Handlers: map[string]queue.Handler{"k": nil}},
		"max attempts":                        {Schema: "ok", MaxAttempts: -2},
		"timeout no kind":                     {Schema: "ok", KindTimeouts: map[string]time.Duration{"x": time.Second}},
		"retention tick":                      {Schema: "ok", Retention: queue.Retention{Interval: time.Millisecond}},
		"batch past the subtransaction cache": {Schema: "ok", MaxBatch: 100},
	} {
		_, err := queue.New(e.pool, cfg)
		require.Error(t, err, name)
		require.True(t, errors.Is(err, queue.ErrInvalidConfig) || errors.Is(err, queue.ErrInvalidSchema), "%s: %v", name, err)
	}
	_, err := queue.New(nil, queue.Config{})
	require.ErrorIs(t, err, queue.ErrInvalidConfig)
	c, err := queue.New(e.pool, queue.Config{Schema: e.schema})
	require.NoError(t, err)
	require.ErrorIs(t, c.Run(ctx), queue.ErrNoQueues)
}

func TestLogsNeverContainPayloads(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.DebugLevel)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: 50 * time.Millisecond,
		Backoff:      func(int) time.Duration { return time.Millisecond },
		Logger:       zap.New(core),
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if j.Attempt == 1 {
				return errors.New("first attempt fails")
			}
			return nil
		})},
	})
	e.run()
	const secret = "s3cr3t-payload-value"
	_, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", MaxAttempts: 3, Payload: map[string]string{"card": secret}})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "job done", func() bool { return e.count(`state = 'succeeded'`) == 1 })
	require.NotZero(t, logs.Len(), "the worker logs its work")
	for _, entry := range logs.All() {
		text := entry.Message
		for k, v := range entry.ContextMap() {
			text += " " + k + "=" + fmt.Sprint(v)
		}
		require.NotContains(t, text, secret)
	}
}

func TestHandlerThatSwallowsADatabaseErrorFails(t *testing.T) {
	t.Parallel()
	var schema string
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Backoff:      func(int) time.Duration { return time.Hour },
		Handlers: map[string]queue.Handler{"sloppy": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			if err := effect(ctx, tx, schema, j); err != nil {
				return err
			}
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored
			return nil
		}), "ok": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return effect(ctx, tx, schema, j)
		})},
	})
	schema = e.schema
	e.run()
	ctx := context.Background()
	// In one batch with a healthy job: only the sloppy one fails.
	res, err := e.c.EnqueueMany(ctx, []queue.NewJob{{Kind: "ok"}, {Kind: "sloppy"}, {Kind: "ok"}})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "outcomes", func() bool {
		return e.count(`state = 'succeeded'`) == 2 && e.count(`attempts = 1 AND state = 'pending'`) == 1
	})
	var lastErr string
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT last_error FROM `+e.table("jobs")+` WHERE id = $1`, res[1].ID).Scan(&lastErr))
	require.Contains(t, lastErr, "handler returned nil but a statement it ran in the claim transaction failed")
	counts := e.effectCounts()
	require.Equal(t, map[int64]int{res[0].ID: 1, res[2].ID: 1}, counts, "the sloppy job's write rolled back")
	checkEventsMatchJobs(t, e.pool, e.schema)
}

// The worker's timer comes from the database when no notification told it:
// jobs enqueued before it started, across several priorities.
func TestWorkerTimerFromDatabaseAcrossPriorities(t *testing.T) {
	t.Parallel()
	ran := make(chan int64, 10)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"default": {}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return nil
		})},
	})
	ctx := context.Background()
	_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Priority: 0, Delay: time.Hour})
	require.NoError(t, err)
	_, err = e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Priority: -5, Delay: 2 * time.Hour})
	require.NoError(t, err)
	soon, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Priority: 7, Delay: time.Second})
	require.NoError(t, err)
	start := time.Now()
	e.run()
	select {
	case id := <-ran:
		require.Equal(t, soon.ID, id)
		require.GreaterOrEqual(t, time.Since(start), 900*time.Millisecond)
	case <-time.After(45 * time.Second): // the poll would take 60s
		t.Fatal("delayed job did not run on the database-derived timer")
	}
	require.Zero(t, e.metric("pgwake_worker_claims_total", map[string]string{"source": "poll"}))
}

// Under a backlog, claims continue after the last claimed job instead of
// re-reading the head of the index; a more urgent job enqueued meanwhile
// must still overtake the backlog soon.
func TestUrgentJobOvertakesBacklog(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []int64
	// The backlog pauses after 200 jobs until the urgent job is enqueued, so
	// plenty of backlog is left however fast the machine is.
	gate := make(chan struct{})
	e := newEnv(t, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {MaxWorkers: 2}},
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			mu.Lock()
			order = append(order, j.ID)
			done := len(order)
			mu.Unlock()
			if done >= 200 {
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})},
	})
	ctx := context.Background()
	const n = 5000
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: "k", Priority: 5}
	}
	_, err := e.c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	e.run()
	done := func() int { mu.Lock(); defer mu.Unlock(); return len(order) }
	waitFor(t, 60*time.Second, "backlog started", func() bool { return done() >= 100 })
	urgent, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Priority: 0})
	require.NoError(t, err)
	mu.Lock()
	atEnqueue := len(order)
	mu.Unlock()
	close(gate)
	waitFor(t, 120*time.Second, "all done", func() bool { return done() == n+1 })
	pos := -1
	for i, id := range order {
		if id == urgent.ID {
			pos = i
		}
	}
	require.GreaterOrEqual(t, pos, 0)
	// At most headEvery (16) claims of MaxBatch jobs pass it, per slot.
	require.Less(t, pos-atEnqueue, 2*16*queue.DefaultMaxBatch+2*queue.DefaultMaxBatch, "urgent job waited behind %d backlog jobs", pos-atEnqueue)
	require.Less(t, pos, n, "urgent job ran before the backlog ended")
}

// One EnqueueMany over 25,000 distinct queues succeeds: the wake-up locks it
// takes are bounded (256 buckets), where one per queue overflowed the
// server's lock table ("out of shared memory").
func TestEnqueueOverManyQueuesTakesBoundedLocks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, queue.Config{})
	const n = 25000
	jobs := make([]queue.NewJob, n)
	for i := range jobs {
		jobs[i] = queue.NewJob{Queue: fmt.Sprintf("tenant_%d", i), Kind: "k"}
	}
	tx, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	res, err := e.c.EnqueueManyTx(ctx, tx, jobs)
	require.NoError(t, err)
	require.Len(t, res, n)
	var locks int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&locks))
	require.Positive(t, locks)
	require.LessOrEqual(t, locks, 256)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, n, e.count(`state = 'pending'`))
}
