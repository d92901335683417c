package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A delayed job's NOTIFY says when it is due as of the producer's
// statement, rounded up to the ms, and arrives late by its trip through
// the listener. The worker times the job by the database instead: it looks
// at the queue, and arms its timer for the job's run_after. Here the hint
// says 2 s for a job due in 1 s (a NOTIFY a second late): the timer is
// armed for the run_after, not for the hint (without the look it was armed
// a second after it).
func TestDelayedHintTimedByDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ran := make(chan time.Duration, 1)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"hinted": {}},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			ran <- time.Since(j.RunAfter)
			return nil
		})},
	})
	signals := queue.EnableTestSignals(e.c)
	e.run()
	signals.WaitAsleep(t, "hinted", 0)
	// A job written with no NOTIFY, then a hint a second late.
	var due time.Time
	require.NoError(t, e.pool.QueryRow(ctx, `INSERT INTO `+e.table("jobs")+` (queue, kind, run_after)
		VALUES ('hinted', 'k', clock_timestamp() + interval '1 second') RETURNING run_after`).Scan(&due))
	_, err := e.pool.Exec(ctx, `SELECT pg_notify($1, 'hinted|2000')`, queue.WakeChannel(e.schema))
	require.NoError(t, err)
	at := signals.WaitArmed(t, "hinted", func(at time.Time) bool { return !at.After(due.Add(500 * time.Millisecond)) })
	require.False(t, at.Before(due), "timer armed for %s, before the job's run_after %s", at, due)
	late := <-ran
	require.GreaterOrEqual(t, late, time.Duration(0), "the job ran before its run_after")
}

// Two delayed jobs of a client whose kinds are all leased: after the timer
// of the first fires and its claim takes every due job, the worker still
// learns of the second (it looks again) and arms its timer for it, rather
// than sleeping until the poll (a minute).
func TestLeasedDelayedJobsEachArmTheTimer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ran := make(chan int64, 2)
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"ld": {MaxWorkers: 4}},
		LeasedKinds:  []string{"k"},
		PollInterval: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(_ context.Context, _ pgx.Tx, j *queue.Job) error {
			ran <- j.ID
			return nil
		})},
	})
	signals := queue.EnableTestSignals(e.c)
	e.run()
	signals.WaitAsleep(t, "ld", 0)
	now := e.dbNow()
	first, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "ld", Kind: "k", RunAfter: now.Add(500 * time.Millisecond)})
	require.NoError(t, err)
	// Three seconds apart, not half a second: one CI run under -race saw
	// no timer armed for the second job, most likely because the first
	// job's run and the look after it took longer than half a second, so
	// that the second was due at that look and claimed without a timer.
	second, err := e.c.Enqueue(ctx, queue.NewJob{Queue: "ld", Kind: "k", RunAfter: now.Add(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, first.ID, <-ran)
	signals.WaitArmed(t, "ld", func(at time.Time) bool {
		return !at.Before(now.Add(3*time.Second)) && at.Before(now.Add(4*time.Second))
	})
	require.Equal(t, second.ID, <-ran)
}
