package events_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/queue"
)

func TestStreamDeliversCommittedEventsInCommitOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
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

// countingPublisher records the size of every Publish call.
type countingPublisher struct {
	message.Publisher
	mu    sync.Mutex
	sizes []int
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	p.sizes = append(p.sizes, len(msgs))
	p.mu.Unlock()
	return p.Publisher.Publish(topic, msgs...)
}

// A transaction larger than MaxBatch goes out in parts, so the stream holds
// at most about MaxBatch of its events at a time, and still in order, once.
func TestLargeTransactionIsPublishedInParts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	pub := &countingPublisher{Publisher: ps}
	cfg := e.Config(pub)
	cfg.MaxBatch = 7
	s, stopStream := e.RunStream(cfg)

	c := e.QueueClient(1)
	_, err := c.EnqueueMany(ctx, make100("ok")) // one transaction, 100 events
	require.NoError(t, err)
	_, err = c.EnqueueMany(ctx, make100("ok")[:3])
	require.NoError(t, err)

	table := e.WaitDelivered(col, 60*time.Second)
	require.Len(t, table, 103)
	got := col.Snapshot()
	checkDelivery(t, got, table)
	require.Len(t, got, 103)
	for i := 1; i < 100; i++ {
		require.Equal(t, got[0].LSN, got[i].LSN, "one transaction, one commit LSN")
	}
	require.Less(t, got[99].LSN, got[100].LSN)
	pub.mu.Lock()
	sizes := append([]int(nil), pub.sizes...)
	pub.mu.Unlock()
	// A batch takes parts until it reaches MaxBatch: at most 2*7-1 events.
	require.LessOrEqual(t, slices.Max(sizes), 13, "publish sizes %v", sizes)
	require.GreaterOrEqual(t, len(sizes), 100/13, "publish sizes %v", sizes)
	waitFor(t, 30*time.Second, "ack past the last commit", func() bool { return uint64(s.Acked()) > got[102].LSN })
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
}
