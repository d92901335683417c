package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/queue"
)

func TestStreamDeliversCommittedEventsInCommitOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps := events.NewGoChannel(nil)
	sub, err := ps.Subscribe(ctx, "pgwake.events")
	require.NoError(t, err)
	col := collect(t, sub)
	s, stopStream := e.RunStream(e.Config(ps))

	c := e.QueueClient(4)
	// A rolled-back transaction's events never appear.
	tx, err := e.Pool.Begin(ctx)
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		_, err := c.EnqueueTx(ctx, tx, queue.NewJob{Kind: "ok"})
		require.NoError(t, err)
	}
	require.NoError(t, tx.Rollback(ctx))

	var jobs []queue.NewJob
	for i := 0; i < 300; i++ {
		jobs = append(jobs, queue.NewJob{Kind: "ok"})
	}
	for i := 0; i < 20; i++ {
		jobs = append(jobs, queue.NewJob{Kind: "bad", MaxAttempts: 3})
	}
	jobs = append(jobs, queue.NewJob{Kind: "ok", Queue: "other"})
	_, err = c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	delayed, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok", Delay: time.Hour})
	require.NoError(t, err)
	err = c.Cancel(ctx, delayed.ID)
	require.NoError(t, err)

	stopQueue := e.RunQueue(c)
	waitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()

	table := e.WaitDelivered(col, 60*time.Second)
	got := col.Snapshot()
	checkDelivery(t, got, table)
	// One session, no redelivery: exactly once, and commit LSNs never go back.
	require.Len(t, got, len(table))
	for i := 1; i < len(got); i++ {
		require.LessOrEqual(t, got[i-1].LSN, got[i].LSN, "commit order")
	}
	// 321 jobs enqueued + cancelled job's 2 + 300 succeeded + 20*(3) fails.
	require.Equal(t, 321+1+300+1+1+20*3, len(table))

	// The acknowledged position passes the last event's commit.
	waitFor(t, 30*time.Second, "ack past the last event", func() bool { return uint64(s.Acked()) > got[len(got)-1].LSN })
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done

	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
}
