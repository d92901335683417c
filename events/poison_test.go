package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/queue"
)

// An event row whose data the stream cannot decode (the app role may
// insert events) is skipped with a log line naming it and a metric; the
// events around it are delivered, in the same session, and the slot moves
// past it.
func TestUndecodableEventIsSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.WarnLevel)
	cfg := e.Config(ps)
	cfg.Registerer, cfg.Logger = reg, zap.New(core)
	s, stopStream := e.RunStream(cfg)

	c := e.QueueClient(1)
	_, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)
	var badID int64
	require.NoError(t, e.Pool.QueryRow(ctx, `INSERT INTO `+e.Table("events")+` (job_id, type, queue, kind, attempt, data)
		VALUES (1, 'failed', 'default', 'ok', 1, '{"run_after": "not a time", "error": 5}') RETURNING id`).Scan(&badID))
	_, err = c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
	require.NoError(t, err)

	waitFor(t, 30*time.Second, "the two good events", func() bool { return len(col.Snapshot()) == 2 })
	got := col.Snapshot()
	waitFor(t, 30*time.Second, "ack past the last event", func() bool { return uint64(s.Acked()) > got[1].LSN })
	require.Equal(t, int64(1), s.Sessions(), "no reconnect")
	require.Equal(t, float64(1), metricSum(t, reg, "pgwake_events_skipped_total"))
	skipped := logs.FilterMessageSnippet("event skipped").All()
	require.Len(t, skipped, 1)
	require.Equal(t, badID, skipped[0].ContextMap()["event_id"])
	for _, r := range got {
		require.NotEqual(t, badID, r.Ev.ID)
	}
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
}
