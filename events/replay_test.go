package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/queue"
)

// A late consumer backfills from the table while the live stream runs, then
// switches to the live stream: each event exactly once, none missing.
func TestBackfillThenLiveHasNoGapNoDuplicate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c := e.QueueClient(4)
	// History from before the slot existed: only the table has it.
	_, err := c.EnqueueMany(ctx, make100("ok"))
	require.NoError(t, err)

	ps, live := channelSink(t) // the live messages, buffered
	_, stopStream := e.RunStream(e.Config(ps))
	stopQueue := e.RunQueue(c)
	stopProducer := e.Produce(c)

	// Backfill while events keep committing.
	waitFor(t, 60*time.Second, "live events", func() bool { return len(live.Snapshot()) > 200 })
	var merged []eventstest.Received
	cu, err := events.Backfill(ctx, e.Pool, e.Schema, events.From{}, func(ev events.Event) error {
		merged = append(merged, eventstest.Received{Ev: ev})
		return nil
	})
	require.NoError(t, err)
	backfilled := len(merged)
	waitFor(t, 60*time.Second, "more live events", func() bool { return len(live.Snapshot()) > 400 })
	stopProducer()
	waitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()
	inBackfill := map[int64]bool{}
	for _, r := range merged {
		inBackfill[r.Ev.ID] = true
	}
	var table map[int64]events.Event
	waitFor(t, 60*time.Second, "every event backfilled or live", func() bool {
		table = e.TableEvents()
		seen := map[int64]bool{}
		for _, r := range live.Snapshot() {
			seen[r.Ev.ID] = true
		}
		for id := range table {
			if !seen[id] && !inBackfill[id] {
				return false
			}
		}
		return true
	})
	stopStream()
	require.NoError(t, ps.Close())
	<-live.Done

	dups := 0
	for _, r := range live.Snapshot() {
		if cu.Live(r.Ev.ID, pglogrepl.LSN(r.LSN)) {
			merged = append(merged, r)
		} else {
			dups++
		}
	}
	t.Logf("%d backfilled, %d live duplicates dropped, %d events", backfilled, dups, len(table))
	require.Positive(t, dups, "the backfill and the live stream overlapped")
	checkDelivery(t, merged, table)
	require.Len(t, merged, len(table), "each event exactly once")
}

func make100(kind string) []queue.NewJob {
	jobs := make([]queue.NewJob, 100)
	for i := range jobs {
		jobs[i] = queue.NewJob{Kind: kind}
	}
	return jobs
}

func TestReadFromIDAndTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c := e.QueueClient(1)
	_, err := c.EnqueueMany(ctx, make100("ok"))
	require.NoError(t, err)
	all := e.TableEvents()
	require.Len(t, all, 100)
	var ids []int64
	require.NoError(t, events.Read(ctx, e.Pool, e.Schema, events.From{}, func(ev events.Event) error {
		ids = append(ids, ev.ID)
		require.Equal(t, events.TypeEnqueued, ev.Type)
		require.NotNil(t, ev.RunAfter)
		return nil
	}))
	require.Len(t, ids, 100)
	var after []int64
	require.NoError(t, events.Read(ctx, e.Pool, e.Schema, events.From{AfterID: ids[49]}, func(ev events.Event) error {
		after = append(after, ev.ID)
		return nil
	}))
	require.Equal(t, ids[50:], after)
	n := 0
	require.NoError(t, events.Read(ctx, e.Pool, e.Schema, events.From{Since: time.Now().Add(time.Hour)}, func(events.Event) error { n++; return nil }))
	require.Zero(t, n)
}

// hundredDoneOnePending runs 100 jobs to success and leaves one delayed job
// pending: 201 events.
func hundredDoneOnePending(t *testing.T) (*eventstest.Env, *queue.Client) {
	e := newEnv(t)
	ctx := context.Background()
	c := e.QueueClient(4)
	_, err := c.EnqueueMany(ctx, make100("ok"))
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok", Delay: time.Hour}) // stays pending
	require.NoError(t, err)
	stop := e.RunQueue(c)
	waitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 1 })
	stop()
	return e, c
}

func TestRetentionKeepsUnfinishedJobsAndVerifyHolds(t *testing.T) {
	t.Parallel()
	e, _ := hundredDoneOnePending(t)
	ctx := context.Background()
	// Nothing is old enough yet.
	n, err := events.DeleteBefore(ctx, e.Pool, e.Schema, time.Now().Add(-time.Hour), 7)
	require.NoError(t, err)
	require.Zero(t, n)
	// Everything finished is older than an hour from now; small batches.
	n, err = events.DeleteBefore(ctx, e.Pool, e.Schema, time.Now().Add(time.Hour), 7)
	require.NoError(t, err)
	require.Equal(t, int64(200), n)
	require.Len(t, e.TableEvents(), 1, "the pending job keeps its history")
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
}

// Job retention deletes finished rows and keeps their events: Verify still
// holds, and event retention then removes the orphaned history.
func TestJobRetentionThenEventRetentionVerifyHolds(t *testing.T) {
	t.Parallel()
	e, c := hundredDoneOnePending(t)
	ctx := context.Background()
	_, err := e.Pool.Exec(ctx, `UPDATE `+e.Table("jobs")+` SET finished_at = now() - interval '2 days' WHERE state = 'succeeded'`)
	require.NoError(t, err)
	deleted, err := c.DeleteFinished(ctx, queue.Retention{})
	require.NoError(t, err)
	require.Equal(t, map[queue.JobState]int64{queue.StateSucceeded: 100}, deleted)
	require.Equal(t, 1, e.Count(`SELECT count(*) FROM `+e.Table("jobs")))
	require.Len(t, e.TableEvents(), 201, "deleting jobs leaves the log alone")
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)

	// The events of deleted jobs go with event retention; the pending job's stay.
	n, err := events.DeleteBefore(ctx, e.Pool, e.Schema, time.Now().Add(time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, int64(200), n)
	mismatches, err = events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Empty(t, mismatches)
}

func TestVerifyFindsADifference(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	c := e.QueueClient(1)
	r, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	// A change made behind the log's back.
	_, err = e.Pool.Exec(ctx, `UPDATE `+e.Table("jobs")+` SET state = 'succeeded', finished_at = now() WHERE id = $1`, r.ID)
	require.NoError(t, err)
	mismatches, err := events.Verify(ctx, e.Pool, e.Schema)
	require.NoError(t, err)
	require.Len(t, mismatches, 1)
	require.Equal(t, r.ID, mismatches[0].JobID)
	require.Contains(t, mismatches[0].String(), "succeeded")
}
