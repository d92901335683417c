package ui_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
	"github.com/pgwake/pgwake/ui"
)

// A job's events reach the stream in their order even when one of them is
// a skipped id the feed re-checks: the pages set a job's state from each
// event in turn, so "cancelled" then "enqueued" showed a cancelled job as
// pending until a reload.
func TestLateEventsReachTheStreamInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := stream(t, sctx, b.url+"/events", "")
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	x, err := b.client.EnqueueTx(ctx, tx, queue.NewJob{Kind: "k"}) // its event id is skipped for now
	require.NoError(t, err)
	other, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	type je struct {
		ID    int64           `json:"id"`
		JobID int64           `json:"job_id"`
		Type  queue.EventType `json:"type"`
	}
	next := func() je {
		t.Helper()
		for {
			select {
			case e, ok := <-ch:
				require.True(t, ok, "the stream ended")
				if e.event == "job" {
					var j je
					require.NoError(t, json.Unmarshal([]byte(e.data), &j))
					return j
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no job event")
			}
		}
	}
	require.Equal(t, other.ID, next().JobID, "the feed delivered the later commit, x's id skipped")
	require.NoError(t, b.client.CancelTx(ctx, tx, x.ID)) // a higher event id, same commit
	require.NoError(t, tx.Commit(ctx))
	first, second := next(), next()
	require.Equal(t, x.ID, first.JobID)
	require.Equal(t, x.ID, second.JobID)
	require.Equal(t, []queue.EventType{queue.EventEnqueued, queue.EventCancelled}, []queue.EventType{first.Type, second.Type},
		"events %d and %d", first.ID, second.ID)
}
