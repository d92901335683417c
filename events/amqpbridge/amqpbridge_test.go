package amqpbridge_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/amqpbridge"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// amqpURL is $PGWAKE_TEST_AMQP_URL or the local broker.
func amqpURL() string {
	if u := os.Getenv("PGWAKE_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

func randomName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func TestStreamToRabbitMQInCommitOrder(t *testing.T) {
	t.Parallel()
	e := eventstest.NewEnv(t)
	ctx := context.Background()
	topic := "pgwake_test_" + randomName()
	queueName := topic + "_q"

	// The consumer's queue is bound before anything is published.
	subCfg := amqpbridge.PubSubConfig(amqpURL())
	subCfg.Queue.GenerateName = wmamqp.GenerateQueueNameConstant(queueName)
	sub, err := wmamqp.NewSubscriber(subCfg, watermill.NopLogger{})
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	col := eventstest.Collect(t, msgs)
	t.Cleanup(func() {
		_ = sub.Close()
		<-col.Done
		conn, err := amqp.Dial(amqpURL())
		if err != nil {
			return
		}
		defer conn.Close()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queueName, false, false, false)
			_ = ch.ExchangeDelete(topic, false, false)
			_ = ch.Close()
		}
	})

	pub, err := amqpbridge.NewPublisher(amqpbridge.Config{URL: amqpURL()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	cfg := e.Config(pub)
	cfg.Topic = events.SingleTopic(topic)
	_, stopStream := e.RunStream(cfg)

	c := e.QueueClient(4)
	var jobs []queue.NewJob
	for i := 0; i < 200; i++ {
		jobs = append(jobs, queue.NewJob{Kind: "ok"})
	}
	jobs = append(jobs, queue.NewJob{Kind: "bad", MaxAttempts: 2})
	_, err = c.EnqueueMany(ctx, jobs)
	require.NoError(t, err)
	stopQueue := e.RunQueue(c)
	eventstest.WaitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()
	table := e.WaitDelivered(col, 60*time.Second)
	require.Len(t, table, 201+200+2)
	stopStream()
	got := col.Snapshot()
	eventstest.CheckDelivery(t, got, table)
	for i := 1; i < len(got); i++ {
		require.LessOrEqual(t, got[i-1].LSN, got[i].LSN, "commit order")
	}
}

func TestUnreachableBroker(t *testing.T) {
	t.Parallel()
	_, err := amqpbridge.NewPublisher(amqpbridge.Config{URL: "amqp://guest:secret@127.0.0.1:1/"})
	require.ErrorIs(t, err, amqpbridge.ErrUnreachable)
	require.Contains(t, err.Error(), "127.0.0.1:1")
	require.NotContains(t, err.Error(), "secret")
}
