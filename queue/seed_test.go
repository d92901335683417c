package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/queue"
)

// SeedFinished writes finished jobs with the events asked for, spaced and
// wrapped as described; EventsOnly writes the history of jobs without rows;
// EventCount and the read API see what it wrote.
func TestSeedFinished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, queue.Config{})
	ctx := context.Background()
	at := time.Now().Add(-time.Hour).Truncate(time.Millisecond)

	n, err := e.c.SeedFinished(ctx, queue.FinishedSeed{Count: 3, Kind: "k", State: queue.StateSucceeded,
		FinishedAt: at, SeqPayload: true, Events: queue.SeedAllEvents})
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	page, err := e.c.JobList(ctx, queue.JobListParams{State: queue.StateSucceeded, WithPayload: true})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 3)
	for i, j := range page.Jobs { // newest first: job 2, 1, 0
		require.Equal(t, queue.DefaultQueue, j.Queue)
		require.Equal(t, 1, j.Attempts)
		require.WithinDuration(t, at, *j.FinishedAt, 0)
		require.WithinDuration(t, at.Add(-time.Minute), j.CreatedAt, 0)
		require.JSONEq(t, fmt.Sprintf(`{"seq": %d}`, -(3-i)), string(j.Payload))
	}
	evs, err := e.c.JobEvents(ctx, page.Jobs[0].ID)
	require.NoError(t, err)
	require.Len(t, evs, 2)
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventSucceeded}, []queue.EventType{evs[0].Type, evs[1].Type})

	last, err := e.c.LastEventID(ctx)
	require.NoError(t, err)
	n, err = e.c.SeedFinished(ctx, queue.FinishedSeed{Count: 5, Queue: "q", Kind: "k", State: queue.StateFailed,
		FinishedAt: at, Spacing: time.Second, Cycle: 2, LastError: "boom", Events: queue.SeedFinalEvent})
	require.NoError(t, err)
	require.EqualValues(t, 5, n)
	page, err = e.c.JobList(ctx, queue.JobListParams{Queue: "q"})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 5)
	for i, j := range page.Jobs { // job 4-i: (4-i) mod 2 seconds before at
		require.Equal(t, queue.StateFailed, j.State)
		require.Equal(t, "boom", j.LastError)
		require.WithinDuration(t, at.Add(-time.Duration((4-i)%2)*time.Second), *j.FinishedAt, 0)
	}
	evs, err = e.c.EventsAfter(ctx, last, 100)
	require.NoError(t, err)
	require.Len(t, evs, 5, "one final event each")
	require.Equal(t, queue.EventFailed, evs[0].Type)
	require.JSONEq(t, `{"error": "boom"}`, string(evs[0].Data))

	last, err = e.c.LastEventID(ctx)
	require.NoError(t, err)
	n, err = e.c.SeedFinished(ctx, queue.FinishedSeed{Count: 4, Kind: "k", State: queue.StateSucceeded, EventsOnly: true})
	require.NoError(t, err)
	require.EqualValues(t, 4, n)
	evs, err = e.c.JobEvents(ctx, -4)
	require.NoError(t, err)
	require.Len(t, evs, 1, "an event of job -4, which has no row")
	_, err = e.c.JobGet(ctx, -4)
	require.ErrorIs(t, err, queue.ErrNotFound)

	after, err := e.c.EventCount(ctx, last)
	require.NoError(t, err)
	require.EqualValues(t, 4, after)
	all, err := e.c.EventCount(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 6+5+4, all)
	require.NoError(t, e.c.VacuumAnalyze(ctx))

	for _, bad := range []queue.FinishedSeed{
		{Count: 0, Kind: "k", State: queue.StateSucceeded},
		{Count: 1, State: queue.StateSucceeded},
		{Count: 1, Kind: "k", State: queue.StatePending},
		{Count: 1, Kind: "k", State: queue.StateSucceeded, Events: 7},
	} {
		_, err := e.c.SeedFinished(ctx, bad)
		require.ErrorIs(t, err, queue.ErrInvalidConfig, "%+v", bad)
	}
}
