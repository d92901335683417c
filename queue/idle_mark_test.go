package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// A loop with one slot that takes the jobs of a quiet queue one at a time
// (each claim asked for a batch and found one job) keeps its idle mark up:
// it does not write its waiter row around every job. The test holds the
// row locked after the loop went idle, so any write would block the loop
// (and the next job would never be claimed); each job is woken by its
// NOTIFY, since the mark stays idle.
func TestQuietQueueKeepsTheIdleMark(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{
		Queues:       map[string]queue.QueueConfig{"quiet": {MaxWorkers: 1}},
		PollInterval: time.Minute,
		// Claims ask for a batch however slow the first run was (-race).
		BatchTarget: time.Minute,
		Handlers: map[string]queue.Handler{"k": queue.HandlerFunc(func(ctx context.Context, tx pgx.Tx, j *queue.Job) error {
			return nil
		})},
	})
	ctx := context.Background()
	signals := queue.EnableTestSignals(e.c)
	e.run()
	// The listener's first Resync makes the loop write its mark again: let
	// it come before the row is locked.
	signals.WaitListening(t)
	// Warm up: the kind's handler time is known after its first run, so
	// later claims ask for a batch.
	_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Queue: "quiet"})
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "warm-up job done, loop marked idle", func() bool {
		return e.count(`state = 'succeeded'`) == 1 &&
			e.countSQL(`SELECT count(*) FROM `+e.table("waiters")+` WHERE queue = 'quiet' AND idle`) == 1
	})
	// Asleep: past the idle barrier and the look after it, the Resync taken.
	signals.WaitAsleep(t, "quiet", 1)

	lock, err := e.pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx) //nolint:errcheck // releases the row at the end
	_, err = lock.Exec(ctx, `SELECT 1 FROM `+e.table("waiters")+` WHERE queue = 'quiet' FOR UPDATE`)
	require.NoError(t, err)
	for i := 2; i <= 4; i++ {
		_, err := e.c.Enqueue(ctx, queue.NewJob{Kind: "k", Queue: "quiet"})
		require.NoError(t, err)
		waitFor(t, 20*time.Second, "job done with the waiter row locked", func() bool {
			return e.count(`state = 'succeeded'`) == i
		})
	}
	require.NoError(t, lock.Rollback(ctx))
}
