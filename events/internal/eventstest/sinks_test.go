package eventstest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/amqpbridge"
	"github.com/pgwake/pgwake/events/internal/eventstest"
	"github.com/pgwake/pgwake/events/natsbridge"
	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/natstest"
	"github.com/pgwake/pgwake/internal/pgtest"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sink is one place the event stream can forward to: a message.Publisher
// for the stream and the channel its messages come back on.
type sink struct {
	name string
	open func(t *testing.T, topic string) (message.Publisher, <-chan *message.Message)
}

func randomName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func amqpURL() string {
	if u := os.Getenv("PGWAKE_TEST_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

var sinks = []sink{
	{"gochannel", func(t *testing.T, topic string) (message.Publisher, <-chan *message.Message) {
		gc := events.NewGoChannel(watermill.NopLogger{})
		ch, err := gc.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		t.Cleanup(func() { _ = gc.Close() })
		return gc, ch
	}},
	{"pgwake pubsub", func(t *testing.T, topic string) (message.Publisher, <-chan *message.Message) {
		// Its own schema: the message jobs have events of their own, which
		// the stream of the test's schema must not see.
		pool := pgtest.Pool(t)
		schema := pgtest.Schema(t)
		_, err := migrations.Up(context.Background(), pool, schema)
		require.NoError(t, err)
		pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: schema, Logger: watermill.NopLogger{}})
		require.NoError(t, err)
		sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema, Logger: watermill.NopLogger{}})
		require.NoError(t, err)
		ch, err := sub.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = pub.Close()
			_ = sub.Close()
		})
		return pub, ch
	}},
	{"nats bridge", func(t *testing.T, topic string) (message.Publisher, <-chan *message.Message) {
		stream := "PGWAKE_TEST_" + randomName()
		natstest.KeepJetStream(t)
		pub, err := natsbridge.NewPublisher(natsbridge.Config{URL: natstest.URL(), Stream: stream, Subjects: []string{topic}})
		require.NoError(t, err)
		nc, err := nats.Connect(natstest.URL())
		require.NoError(t, err)
		js, err := nc.JetStream()
		require.NoError(t, err)
		sub, err := js.SubscribeSync(topic, nats.OrderedConsumer(), nats.DeliverAll())
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		out := make(chan *message.Message)
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer close(out)
			for ctx.Err() == nil {
				m, err := sub.NextMsgWithContext(ctx)
				if err != nil {
					continue
				}
				msg := message.NewMessage(m.Header.Get(nats.MsgIdHdr), m.Data)
				for k := range m.Header {
					msg.Metadata.Set(k, m.Header.Get(k))
				}
				select {
				case out <- msg:
				case <-ctx.Done():
				}
			}
		}()
		t.Cleanup(func() {
			cancel()
			<-done
			_ = sub.Unsubscribe()
			_ = js.DeleteStream(stream)
			nc.Close()
			_ = pub.Close()
		})
		return pub, out
	}},
	{"amqp bridge", func(t *testing.T, topic string) (message.Publisher, <-chan *message.Message) {
		queueName := topic + "_q"
		subCfg := amqpbridge.PubSubConfig(amqpURL())
		subCfg.Queue.GenerateName = wmamqp.GenerateQueueNameConstant(queueName)
		sub, err := wmamqp.NewSubscriber(subCfg, watermill.NopLogger{})
		require.NoError(t, err)
		ch, err := sub.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		pub, err := amqpbridge.NewPublisher(amqpbridge.Config{URL: amqpURL()})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = pub.Close()
			_ = sub.Close()
			conn, err := amqp.Dial(amqpURL())
			if err != nil {
				return
			}
			defer conn.Close()
			if c, err := conn.Channel(); err == nil {
				_, _ = c.QueueDelete(queueName, false, false, false)
				_ = c.ExchangeDelete(topic, false, false)
				_ = c.Close()
			}
		})
		return pub, ch
	}},
}

// TestEverySinkDeliversTheSame forwards one workload's event stream to
// every sink (the in-process GoChannel, pgwake's own Pub/Sub, the NATS
// JetStream and RabbitMQ bridges) and holds each to the same checks: every
// event of the table arrives, nothing else does, a job's events arrive in
// id order and all of them in commit (LSN) order.
func TestEverySinkDeliversTheSame(t *testing.T) {
	for _, s := range sinks {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			e := eventstest.NewEnv(t)
			ctx := context.Background()
			topic := "pgwake_test_" + randomName()
			pub, ch := s.open(t, topic)
			col := eventstest.Collect(t, ch)

			cfg := e.Config(pub)
			cfg.Topic = events.SingleTopic(topic)
			_, stopStream := e.RunStream(cfg)
			c := e.QueueClient(4)
			var jobs []queue.NewJob
			for range 100 {
				jobs = append(jobs, queue.NewJob{Kind: "ok"})
			}
			jobs = append(jobs, queue.NewJob{Kind: "bad", MaxAttempts: 2})
			_, err := c.EnqueueMany(ctx, jobs)
			require.NoError(t, err)
			stopQueue := e.RunQueue(c)
			eventstest.WaitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
			stopQueue()
			table := e.WaitDelivered(col, 60*time.Second)
			require.Len(t, table, 101+100+2)
			stopStream()
			got := col.Snapshot()
			eventstest.CheckDelivery(t, got, table)
			for i := 1; i < len(got); i++ {
				require.LessOrEqual(t, got[i-1].LSN, got[i].LSN, "commit order")
			}
		})
	}
}
