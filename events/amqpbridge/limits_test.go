package amqpbridge_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/amqpbridge"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/queue"
)

// cleanupAMQP deletes queue and exchanges when the test ends.
func cleanupAMQP(t *testing.T, queueName string, exchanges ...string) {
	t.Cleanup(func() {
		conn, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			if queueName != "" {
				_, _ = ch.QueueDelete(queueName, false, false, false)
			}
			for _, x := range exchanges {
				_ = ch.ExchangeDelete(x, false, false)
			}
			_ = ch.Close()
		}
	})
}

// The forwarder starts before any consumer bound a queue to the topic's
// exchange (a new deployment; with --topic-by queue, every new queue
// name): RabbitMQ confirms a message that no queue takes and drops it. The
// events must wait for a queue (a fault costs latency, not events): before,
// they were confirmed, acknowledged to PostgreSQL and lost.
func TestEventsWithNoQueueBoundAreNotLost(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		e := eventstest.NewEnv(t)
		ctx := context.Background()
		topic := "pgwake_test_" + randomName()
		queueName := topic + "_q"
		cleanupAMQP(t, queueName, topic)
		pub, err := amqpbridge.NewPublisher(amqpbridge.Config{URL: amqpURL(), SyncPublish: sync})
		require.NoError(t, err)
		cfg := e.Config(pub)
		cfg.Topic = events.SingleTopic(topic)
		cfg.MinBackoff, cfg.MaxBackoff = 20*time.Millisecond, 200*time.Millisecond
		_, stopStream := e.RunStream(cfg)
		c := e.QueueClient(1)
		for i := 0; i < 3; i++ {
			_, err := c.Enqueue(ctx, queue.NewJob{Kind: "ok"})
			require.NoError(t, err)
		}
		time.Sleep(2 * time.Second) // the stream tries meanwhile

		subCfg := amqpbridge.PubSubConfig(amqpURL())
		subCfg.Queue.GenerateName = wmamqp.GenerateQueueNameConstant(queueName)
		sub, err := wmamqp.NewSubscriber(subCfg, watermill.NopLogger{})
		require.NoError(t, err)
		msgs, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		col := eventstest.Collect(t, msgs)
		table := e.WaitDelivered(col, 30*time.Second)
		require.Len(t, table, 3, "sync=%v", sync)
		eventstest.CheckDelivery(t, col.Snapshot(), table)
		stopStream()
		require.NoError(t, pub.Close())
		require.NoError(t, sub.Close())
		<-col.Done
	}
}

// watermill-amqp v3.0.2's subscriber reads its deliveries channel without
// checking that it is open (subscriber.go, ProcessMessages: `case amqpMsg
// := <-amqpMsgs`). When RabbitMQ cancels its consumer (here: its queue is
// deleted) the channel closes, and the subscriber hands the application
// one message with no payload and no metadata before it gives up on the
// channel. This is the empty message a probe of the bridge under
// connection cuts saw (stop 37): it comes from the consumer's library,
// not from the bridge. events.Decode rejects it (docs/events.md,
// "Bridges"). If this test fails, watermill-amqp changed: update the docs.
func TestWatermillAMQPSubscriberHandsOutAnEmptyMessageWhenCancelled(t *testing.T) {
	t.Parallel()
	topic := "pgwake_test_" + randomName()
	queueName := topic + "_q"
	cleanupAMQP(t, queueName, topic)
	subCfg := amqpbridge.PubSubConfig(amqpURL())
	subCfg.Queue.GenerateName = wmamqp.GenerateQueueNameConstant(queueName)
	sub, err := wmamqp.NewSubscriber(subCfg, watermill.NopLogger{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), topic)
	require.NoError(t, err)
	conn, err := amqp.Dial(amqpURL())
	require.NoError(t, err)
	defer conn.Close()
	// Deleting the queue once the subscriber consumes from it cancels
	// the consumer. (A passive declare of a queue not there yet closes its
	// channel: a channel per look.)
	eventstest.WaitFor(t, 10*time.Second, "the subscriber consuming", func() bool {
		ch, err := conn.Channel()
		require.NoError(t, err)
		defer ch.Close()
		q, err := ch.QueueDeclarePassive(queueName, true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	})
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDelete(queueName, false, false, false)
	require.NoError(t, err)
	select {
	case m := <-msgs:
		require.Empty(t, m.Payload, "a message nobody published")
		require.Empty(t, m.Metadata)
		_, err := events.Decode(m.Payload)
		require.ErrorIs(t, err, events.ErrDecode)
		m.Ack()
	case <-time.After(10 * time.Second):
		t.Fatal("no message after the consumer was cancelled: watermill-amqp no longer hands out an empty one; update docs/events.md")
	}
}
