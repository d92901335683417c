package events_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/events"
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

// refusingPublisher refuses every publish to one topic, as a broker
// refuses a subject no stream captures.
type refusingPublisher struct {
	message.Publisher
	refused string
}

func (p *refusingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if topic == p.refused {
		return errors.New("nats: no responders available for request")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// An event whose topic the broker refuses goes, after PublishAttempts, to
// the dead-letter topic, logged with its id; the events around it are
// delivered in the same session and the slot moves past it.
func TestEventItsTopicRefusesGoesToDeadLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	deadSub, err := ps.Subscribe(ctx, "pgwake.events.dead")
	require.NoError(t, err)
	dead := collect(t, deadSub)
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.WarnLevel)
	cfg := e.Config(&refusingPublisher{Publisher: ps, refused: "pgwake.events.refused"})
	cfg.Registerer, cfg.Logger = reg, zap.New(core)
	cfg.MinBackoff, cfg.PublishAttempts, cfg.DeadLetterTopic = 10*time.Millisecond, 3, "pgwake.events.dead"
	cfg.Topic = func(ev events.Event) string {
		if ev.Queue == "poison" {
			return "pgwake.events.refused"
		}
		return "pgwake.events"
	}
	s, stopStream := e.RunStream(cfg)

	c := e.QueueClient(1)
	for _, q := range []string{"default", "poison", "default"} {
		_, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok", Queue: q})
		require.NoError(t, err)
	}
	waitFor(t, 30*time.Second, "two events delivered, one dead-lettered", func() bool {
		return len(col.Snapshot()) == 2 && len(dead.Snapshot()) == 1
	})
	got, poisoned := col.Snapshot(), dead.Snapshot()[0]
	require.Equal(t, "poison", poisoned.Ev.Queue)
	waitFor(t, 30*time.Second, "ack past the last event", func() bool { return uint64(s.Acked()) > got[1].LSN })
	require.Equal(t, int64(1), s.Sessions(), "no reconnect")
	require.Equal(t, float64(1), metricSum(t, reg, "pgwake_events_dead_lettered_total"))
	require.GreaterOrEqual(t, metricSum(t, reg, "pgwake_events_publish_errors_total"), float64(3))
	lines := logs.FilterMessageSnippet("dead-letter").All()
	require.Len(t, lines, 1)
	require.Equal(t, poisoned.Ev.ID, lines[0].ContextMap()["event_id"])
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
	<-dead.Done
}
