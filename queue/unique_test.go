package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// uniqueEnv is a client with kinds "a" and "b" on queues default and other,
// not running.
func uniqueEnv(t *testing.T) *env {
	noop := queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error { return nil })
	return newEnv(t, queue.Config{
		Queues:   map[string]queue.QueueConfig{"default": {}, "other": {}},
		Handlers: map[string]queue.Handler{"a": noop, "b": noop},
	})
}

func enq(t *testing.T, e *env, j queue.NewJob) queue.EnqueueResult {
	t.Helper()
	r, err := e.c.Enqueue(context.Background(), j)
	require.NoError(t, err)
	return r
}

// By default a key is unique per kind: a job of another kind with the same
// key is enqueued (it used to be dropped); the same kind gets the holder.
func TestUniqueScopeKind(t *testing.T) {
	t.Parallel()
	e := uniqueEnv(t)
	a := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "k"})
	b := enq(t, e, queue.NewJob{Kind: "b", UniqueKey: "k"})
	require.False(t, b.Duplicate, "another kind has its own key space")
	again := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "k", Queue: "other"})
	require.Equal(t, queue.EnqueueResult{ID: a.ID, Duplicate: true}, again, "same kind, another queue: held")
	res, err := e.c.EnqueueMany(context.Background(), []queue.NewJob{
		{Kind: "a", UniqueKey: "k"}, {Kind: "b", UniqueKey: "k2"}, {Kind: "a", UniqueKey: "k2"}, {Kind: "b", UniqueKey: "k2"},
	})
	require.NoError(t, err)
	require.Equal(t, queue.EnqueueResult{ID: a.ID, Duplicate: true}, res[0])
	require.False(t, res[1].Duplicate)
	require.False(t, res[2].Duplicate)
	require.Equal(t, queue.EnqueueResult{ID: res[1].ID, Duplicate: true}, res[3])
	require.Equal(t, 4, e.count(`true`))
}

// Scoped by queue, a key is held across kinds within one queue.
func TestUniqueScopeQueue(t *testing.T) {
	t.Parallel()
	e := uniqueEnv(t)
	a := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "k", UniqueScope: queue.UniqueByQueue})
	b := enq(t, e, queue.NewJob{Kind: "b", UniqueKey: "k", UniqueScope: queue.UniqueByQueue})
	require.Equal(t, queue.EnqueueResult{ID: a.ID, Duplicate: true}, b)
	c := enq(t, e, queue.NewJob{Kind: "b", UniqueKey: "k", UniqueScope: queue.UniqueByQueue, Queue: "other"})
	require.False(t, c.Duplicate, "another queue")
	d := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "k"})
	require.False(t, d.Duplicate, "the kind scope is another key space than the queue scope")
}

// The holds, through real attempts in leased mode (where running is a state
// of its own): pending frees the key when the attempt starts, active when
// the job finishes, succeeded only when it fails or is cancelled.
func TestUniqueHolds(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan int64, 10)
	h := queue.HandlerFunc(func(ctx context.Context, _ pgx.Tx, j *queue.Job) error {
		started <- j.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	e := newEnv(t, queue.Config{
		Queues:      map[string]queue.QueueConfig{"default": {MaxWorkers: 4}},
		Handlers:    map[string]queue.Handler{"slow": h},
		LeasedKinds: []string{"slow"},
	})
	e.run()
	for _, hold := range []queue.UniqueHold{queue.UniqueHoldPending, queue.UniqueHoldActive, queue.UniqueHoldSucceeded} {
		key := string(hold)
		a := enq(t, e, queue.NewJob{Kind: "slow", UniqueKey: key, UniqueHold: hold})
		require.Equal(t, a.ID, <-started)
		waitFor(t, 10*time.Second, "running", func() bool { return e.count(`id = $1 AND state = 'running'`, a.ID) == 1 })
		b := enq(t, e, queue.NewJob{Kind: "slow", UniqueKey: key, UniqueHold: hold, Delay: time.Hour})
		if hold == queue.UniqueHoldPending {
			require.False(t, b.Duplicate, "%s: a running job does not hold the key", hold)
			require.NoError(t, e.c.Cancel(context.Background(), b.ID))
		} else {
			require.Equal(t, queue.EnqueueResult{ID: a.ID, Duplicate: true}, b, "%s: a running job holds the key", hold)
		}
		release <- struct{}{}
		waitFor(t, 10*time.Second, "succeeded", func() bool { return e.count(`id = $1 AND state = 'succeeded'`, a.ID) == 1 })
		c := enq(t, e, queue.NewJob{Kind: "slow", UniqueKey: key, UniqueHold: hold, Delay: time.Hour})
		if hold == queue.UniqueHoldSucceeded {
			require.Equal(t, queue.EnqueueResult{ID: a.ID, Duplicate: true}, c, "a succeeded job holds the key")
			continue
		}
		require.False(t, c.Duplicate, "%s: a succeeded job does not hold the key", hold)
		d := enq(t, e, queue.NewJob{Kind: "slow", UniqueKey: key, UniqueHold: hold})
		require.Equal(t, queue.EnqueueResult{ID: c.ID, Duplicate: true}, d, "%s: a pending job holds the key", hold)
		require.NoError(t, e.c.Cancel(context.Background(), c.ID))
		f := enq(t, e, queue.NewJob{Kind: "slow", UniqueKey: key, UniqueHold: hold, Delay: time.Hour})
		require.False(t, f.Duplicate, "%s: a cancelled job does not hold the key", hold)
		require.NoError(t, e.c.Cancel(context.Background(), f.ID))
	}
}

// A period holds the key from the enqueue whatever becomes of the job, and
// says until when; once it has passed the next enqueue takes the key.
func TestUniquePeriod(t *testing.T) {
	t.Parallel()
	e := uniqueEnv(t)
	ctx := context.Background()
	before := e.dbNow()
	a := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "d", UniquePeriod: time.Hour})
	require.False(t, a.Duplicate)
	require.NoError(t, e.c.Cancel(ctx, a.ID))
	b := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "d", UniquePeriod: time.Hour})
	require.True(t, b.Duplicate, "the period holds the key after its job was cancelled")
	require.Equal(t, a.ID, b.ID)
	require.WithinDuration(t, before.Add(time.Hour), b.HeldUntil, time.Minute)
	other := enq(t, e, queue.NewJob{Kind: "b", UniqueKey: "d", UniquePeriod: time.Hour})
	require.False(t, other.Duplicate, "scoped by kind")

	res, err := e.c.EnqueueMany(ctx, []queue.NewJob{
		{Kind: "a", UniqueKey: "m", UniquePeriod: time.Minute}, {Kind: "a"}, {Kind: "a", UniqueKey: "m", UniquePeriod: time.Minute},
		{Kind: "a", UniqueKey: "d", UniquePeriod: time.Hour}, {Kind: "a", UniqueKey: "plain"},
	})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.False(t, res[1].Duplicate)
	require.True(t, res[2].Duplicate)
	require.Equal(t, res[0].ID, res[2].ID)
	require.Equal(t, a.ID, res[3].ID)
	require.True(t, res[3].Duplicate)
	require.False(t, res[4].Duplicate)
	require.Less(t, res[0].ID, res[1].ID, "ids in input order")
	require.Less(t, res[1].ID, res[4].ID, "ids in input order")
	for _, i := range []int{0, 1, 4} {
		require.Equal(t, 1, e.count(`id = $1`, res[i].ID), "job %d inserted with its id", i)
	}

	// The period passes (moved back here rather than waited for); retention
	// deletes the expired row; the key is free.
	_, err = e.pool.Exec(ctx, `UPDATE `+e.table("unique_periods")+` SET held_until = now() - interval '1 second' WHERE job_id = $1`, a.ID)
	require.NoError(t, err)
	_, err = e.c.DeleteFinished(ctx, queue.Retention{})
	require.NoError(t, err)
	require.Equal(t, 0, e.countSQL(`SELECT count(*) FROM `+e.table("unique_periods")+` WHERE job_id = $1`, a.ID))
	c := enq(t, e, queue.NewJob{Kind: "a", UniqueKey: "d", UniquePeriod: time.Hour})
	require.False(t, c.Duplicate)
}

// Retry of a failed job whose key another job holds now fails with
// ErrUniqueKeyHeld naming the holder, and changes nothing.
func TestRetryUniqueKeyHeld(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{
		Queues: map[string]queue.QueueConfig{"default": {}},
		Handlers: map[string]queue.Handler{"bad": queue.HandlerFunc(func(context.Context, pgx.Tx, *queue.Job) error {
			return errors.New("no")
		})},
	})
	stop := e.run()
	ctx := context.Background()
	a := enq(t, e, queue.NewJob{Kind: "bad", UniqueKey: "r", MaxAttempts: 1})
	waitFor(t, 10*time.Second, "failed", func() bool { return e.count(`id = $1 AND state = 'failed'`, a.ID) == 1 })
	stop()
	b := enq(t, e, queue.NewJob{Kind: "bad", UniqueKey: "r"})
	require.False(t, b.Duplicate, "a failed job frees its key")
	err := e.c.Retry(ctx, a.ID)
	require.ErrorIs(t, err, queue.ErrUniqueKeyHeld)
	var held *queue.UniqueKeyHeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, queue.UniqueKeyHeldError{JobID: a.ID, HolderID: b.ID}, *held)
	require.Equal(t, 1, e.count(`id = $1 AND state = 'failed'`, a.ID))
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventFailed}, e.eventTypes(a.ID))
	require.NoError(t, e.c.Cancel(ctx, b.ID))
	require.NoError(t, e.c.Retry(ctx, a.ID), "free again")
}

// Bad scopes, holds and periods are refused before anything is written, in
// Go and in the SQL API (PW009, PW010).
func TestUniqueOptionsValidated(t *testing.T) {
	t.Parallel()
	e := uniqueEnv(t)
	ctx := context.Background()
	for field, j := range map[string]queue.NewJob{
		"unique_scope":  {Kind: "a", UniqueKey: "k", UniqueScope: "tenant"},
		"unique_hold":   {Kind: "a", UniqueKey: "k", UniqueHold: "forever"},
		"unique_period": {Kind: "a", UniqueKey: "k", UniqueHold: queue.UniqueHoldSucceeded, UniquePeriod: time.Hour},
		"unique_key":    {Kind: "a", UniqueScope: queue.UniqueByQueue},
	} {
		_, err := e.c.EnqueueMany(ctx, []queue.NewJob{{Kind: "a"}, j})
		var je *queue.JobError
		require.ErrorAs(t, err, &je, field)
		require.Equal(t, field, je.Field)
		require.Equal(t, 1, je.Index)
		require.ErrorIs(t, err, queue.ErrInvalidUniqueKey)
	}
	for code, args := range map[string]string{
		"PW009": `unique_scope => 'tenant'`,
		"PW010": `unique_hold => 'forever'`,
	} {
		_, err := e.pool.Exec(ctx, `SELECT `+e.table("enqueue")+`('a', unique_key => 'k', `+args+`)`)
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, code, pe.Code, args)
	}
	for _, args := range []string{`unique_period => interval '-1 second'`, `unique_hold => 'pending', unique_period => interval '1 hour'`, `unique_hold => 'period'`} {
		_, err := e.pool.Exec(ctx, `SELECT `+e.table("enqueue_many")+`(jsonb_build_array(jsonb_build_object('kind', 'a', 'unique_key', 'k') || $1::jsonb))`,
			map[string]string{
				`unique_period => interval '-1 second'`:                        `{"unique_period": "-1 second"}`,
				`unique_hold => 'pending', unique_period => interval '1 hour'`: `{"unique_hold": "pending", "unique_period": "1 hour"}`,
				`unique_hold => 'period'`:                                      `{"unique_hold": "period"}`,
			}[args])
		var pe *pgconn.PgError
		require.ErrorAs(t, err, &pe, args)
		require.Equal(t, "PW010", pe.Code, args)
	}
	require.Equal(t, 0, e.count(`true`))
	// The SQL API takes the same options.
	var id, again int64
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT `+e.table("enqueue")+`('a', unique_key => 'q', unique_scope => 'queue')`).Scan(&id))
	require.NoError(t, e.pool.QueryRow(ctx, `SELECT `+e.table("enqueue")+`('b', unique_key => 'q', unique_scope => 'queue')`).Scan(&again))
	require.Equal(t, id, again)
}

// Unique periods the SQL side refuses (under a microsecond, which
// PostgreSQL stores as 0; 36,000 days and more, its interval '100 years')
// are a *JobError on unique_period before any call, not a raw PW010.
func TestUniquePeriodOutOfRangeIsJobError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	for _, d := range []time.Duration{500 * time.Nanosecond, 36000 * 24 * time.Hour, 200 * 365 * 24 * time.Hour} {
		_, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", UniqueKey: "a", UniquePeriod: d})
		var je *queue.JobError
		require.ErrorAs(t, err, &je, "period %s: %v", d, err)
		require.ErrorIs(t, err, queue.ErrInvalidUniqueKey)
		require.Equal(t, "unique_period", je.Field)
	}
	for _, d := range []time.Duration{time.Microsecond, 36000*24*time.Hour - time.Second} {
		_, err := e.c.Enqueue(context.Background(), queue.NewJob{Kind: "k", UniqueKey: d.String(), UniquePeriod: d})
		require.NoError(t, err, "period %s", d)
	}
	require.Equal(t, 2, e.count(`true`))
}

// Two batches with the same unique keys in opposite orders wait for each
// other instead of deadlocking: enqueue_jobs takes keys in key order
// (migration 0023). Made deterministic by a third transaction holding key
// "c": the first batch (a, c, b) waits on it holding "a" (in input order it
// would not hold "b" yet), the second (b, a) then waits on the first; when
// "c" commits, both finish. Waiting batches are counted by this test's own
// schema: the two subtests run in parallel in one database, and counting
// the other's batch started the second batch before the first held "a".
func TestUniqueBatchesInOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	for _, period := range []time.Duration{0, time.Hour} {
		t.Run(map[bool]string{true: "period", false: "active"}[period > 0], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, queue.Config{})
			ctx := context.Background()
			job := func(key string) queue.NewJob { return queue.NewJob{Kind: "k", UniqueKey: key, UniquePeriod: period} }
			tx0, err := e.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx0.Rollback(ctx) }()
			_, err = e.c.EnqueueTx(ctx, tx0, job("c"))
			require.NoError(t, err)
			waiting := func(n int) {
				t.Helper()
				require.Eventually(t, func() bool {
					var w int
					require.NoError(t, e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0 AND datname = current_database()`, e.table("enqueue_jobs")).Scan(&w))
					return w >= n
				}, 20*time.Second, 10*time.Millisecond, "%d batches waiting", n)
			}
			type out struct {
				res []queue.EnqueueResult
				err error
			}
			first, second := make(chan out, 1), make(chan out, 1)
			go func() {
				res, err := e.c.EnqueueMany(ctx, []queue.NewJob{job("a"), job("c"), job("b")})
				first <- out{res, err}
			}()
			waiting(1)
			go func() {
				res, err := e.c.EnqueueMany(ctx, []queue.NewJob{job("b"), job("a")})
				second <- out{res, err}
			}()
			waiting(2)
			require.NoError(t, tx0.Commit(ctx))
			o1, o2 := <-first, <-second
			require.NoError(t, o1.err, "first batch")
			require.NoError(t, o2.err, "second batch")
			require.True(t, o1.res[1].Duplicate, "c was the third transaction's")
			require.False(t, o1.res[0].Duplicate)
			require.False(t, o1.res[2].Duplicate)
			require.Equal(t, []bool{true, true}, []bool{o2.res[0].Duplicate, o2.res[1].Duplicate}, "a and b were the first batch's")
			require.Equal(t, o1.res[2].ID, o2.res[0].ID)
			require.Equal(t, o1.res[0].ID, o2.res[1].ID)
			require.Less(t, o1.res[0].ID, o1.res[2].ID, "ids in input order")
			require.Equal(t, 3, e.count(`true`))
		})
	}
}
