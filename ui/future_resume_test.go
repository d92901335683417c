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

// A Last-Event-ID above every event this process has seen (from another
// process behind the same balancer, or before the database was restored)
// resumes from this process's resume point: the events above it that the
// feed already sent (a skipped id held the resume point back) come too.
func TestFutureLastEventIDGetsEventsAboveTheResumePoint(t *testing.T) {
	t.Parallel()
	b := setup(t, ui.Config{})
	ctx := context.Background()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch0 := stream(t, sctx, b.url+"/events", "")
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = b.client.EnqueueTx(ctx, tx, queue.NewJob{Kind: "k"}) // holds the resume point back
	require.NoError(t, err)
	later, err := b.client.Enqueue(ctx, queue.NewJob{Kind: "k"})
	require.NoError(t, err)
	jobOf := func(ch <-chan sseEvent, what string) int64 {
		t.Helper()
		for {
			select {
			case e, ok := <-ch:
				require.True(t, ok, "the stream ended")
				if e.event == "job" {
					var je struct {
						JobID int64 `json:"job_id"`
					}
					require.NoError(t, json.Unmarshal([]byte(e.data), &je))
					return je.JobID
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("%s: no job event", what)
			}
		}
	}
	require.Equal(t, later.ID, jobOf(ch0, "first stream"), "the feed sent the later job's event")
	ch := stream(t, sctx, b.url+"/events", "1000000")
	require.Equal(t, later.ID, jobOf(ch, "stream resuming from a future id"))
}
