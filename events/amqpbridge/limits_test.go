package amqpbridge_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
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

// tcpProxy forwards to target; cut closes every connection through it.
type tcpProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	stall  bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpProxy{ln: ln, target: target}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
	return p
}

func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// The connection to RabbitMQ is cut three times while a producer commits:
// every event reaches the bound queue, in order per job (duplicates by id
// allowed), and the stream never stops.
func TestAMQPConnectionCutLosesNothing(t *testing.T) {
	t.Parallel()
	e := eventstest.NewEnv(t)
	ctx := context.Background()
	topic := "pgwake_test_" + randomName()
	queueName := topic + "_q"
	cleanupAMQP(t, queueName, topic)
	subCfg := amqpbridge.PubSubConfig(amqpURL())
	subCfg.Queue.GenerateName = wmamqp.GenerateQueueNameConstant(queueName)
	sub, err := wmamqp.NewSubscriber(subCfg, watermill.NopLogger{})
	require.NoError(t, err)
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	col := eventstest.Collect(t, msgs)

	p := newTCPProxy(t, "127.0.0.1:5672")
	url := strings.Replace(amqpURL(), "127.0.0.1:5672", p.ln.Addr().String(), 1)
	pub, err := amqpbridge.NewPublisher(amqpbridge.Config{URL: url, ConfirmTimeout: 3 * time.Second})
	require.NoError(t, err)
	cfg := e.Config(pub)
	cfg.Topic = events.SingleTopic(topic)
	cfg.MaxBackoff = 300 * time.Millisecond
	_, stopStream := e.RunStream(cfg)
	c := e.QueueClient(2)
	stopQueue := e.RunQueue(c)
	stopProduce := e.Produce(c)
	for i := 0; i < 3; i++ {
		time.Sleep(700 * time.Millisecond)
		p.cut()
	}
	time.Sleep(500 * time.Millisecond)
	stopProduce()
	eventstest.WaitFor(t, 60*time.Second, "jobs finished", func() bool { return e.PendingJobs() == 0 })
	stopQueue()
	table := e.WaitDelivered(col, 60*time.Second)
	stopStream()
	eventstest.CheckDelivery(t, col.Snapshot(), table)
	t.Logf("%d events, %d messages", len(table), len(col.Snapshot()))
	require.NoError(t, pub.Close())
	require.NoError(t, sub.Close())
	<-col.Done
}
