package pubsub_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/queue"
)

// A Nack is redelivered after the subscriber's RetryPolicy, which sees the
// attempt and ErrNacked; the attempt is in the metadata; the last Nack
// publishes the message to PoisonTopic, rolls back the handler's writes of
// that delivery and completes the job.
func TestNackRetryPolicyAttemptsAndPoisonTopic(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.writes (attempt int)`)
	require.NoError(t, err)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 3})
	var mu sync.Mutex
	var asked []int
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{
		Schema:      schema,
		PoisonTopic: "dead letters",
		RetryPolicy: func(j *queue.Job, err error) time.Duration {
			if errors.Is(err, pubsub.ErrNacked) {
				mu.Lock()
				asked = append(asked, j.Attempt)
				mu.Unlock()
			}
			return 10 * time.Millisecond
		},
	})
	poisonSub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "ops"})
	require.NoError(t, poisonSub.SubscribeInitialize("dead letters"))
	ch, err := sub.Subscribe(ctx, "orders")
	require.NoError(t, err)

	in := message.NewMessage("m1", []byte("payload"))
	in.Metadata.Set("k", "v")
	require.NoError(t, pub.Publish("orders", in))
	for attempt := 1; attempt <= 3; attempt++ {
		m := receive(t, ch, wait)
		require.Equal(t, strconv.Itoa(attempt), m.Metadata.Get(pubsub.AttemptKey))
		require.Equal(t, "3", m.Metadata.Get(pubsub.MaxAttemptsKey))
		tx, ok := pubsub.TxFromContext(m.Context())
		require.True(t, ok)
		_, err := tx.Exec(m.Context(), `INSERT INTO `+schema+`.writes VALUES ($1)`, attempt)
		require.NoError(t, err)
		m.Nack()
	}

	pch, err := poisonSub.Subscribe(ctx, "dead letters")
	require.NoError(t, err)
	p := receive(t, pch, wait)
	require.Equal(t, "m1", p.UUID)
	require.Equal(t, message.Payload("payload"), p.Payload)
	require.Equal(t, "v", p.Metadata.Get("k"))
	require.Equal(t, "orders", p.Metadata.Get(middleware.PoisonedTopicKey))
	require.Contains(t, p.Metadata.Get(middleware.ReasonForPoisonedKey), "attempt 3 of 3")
	require.True(t, p.Ack())

	waitFor(t, wait, "the orders job completed", func() bool {
		return countJobs(t, pool, schema, "payload->>'topic' = 'orders' AND state = 'succeeded'") == 1
	})
	require.Equal(t, 0, countJobs(t, pool, schema, "state = 'failed'"))
	var writes int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.writes`).Scan(&writes))
	require.Zero(t, writes, "every Nacked delivery's writes rolled back")
	mu.Lock()
	require.Contains(t, asked, 1)
	require.Contains(t, asked, 2)
	mu.Unlock()

	// Without a PoisonTopic the last Nack fails the job.
	sub2 := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, NackBackoff: -1})
	ch2, err := sub2.Subscribe(ctx, "plain")
	require.NoError(t, err)
	pub1 := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 1})
	require.NoError(t, pub1.Publish("plain", message.NewMessage("m2", nil)))
	receive(t, ch2, wait).Nack()
	waitFor(t, wait, "job failed", func() bool { return countJobs(t, pool, schema, "state = 'failed'") == 1 })

	_, err = pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{PoisonTopic: "bad\x00topic"})
	require.ErrorIs(t, err, pubsub.ErrInvalidConfig)
	require.Equal(t, middleware.ReasonForPoisonedKey, pubsub.ReasonPoisonedKey)
	require.Equal(t, middleware.PoisonedTopicKey, pubsub.PoisonedTopicKey)
}

// Watermill's Router with CorrelationID, PoisonQueue, Retry and Recoverer
// over pgwake's Pub/Sub, end to end: a handler that fails or panics is
// retried in place by Retry, then PoisonQueue publishes it (through pgwake)
// to the poison topic and acks; a handler without PoisonQueue Nacks, pgwake
// redelivers it (attempts in metadata) and its last Nack goes to the same
// poison topic; a handler that succeeds publishes with the correlation ID.
func TestRouterMiddlewareChain(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 2})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, NackBackoff: -1, PoisonTopic: "poison"})
	observe := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "observer"})
	for _, topic := range []string{"poison", "out"} {
		require.NoError(t, observe.SubscribeInitialize(topic))
	}

	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	require.NoError(t, err)
	poisonQueue, err := middleware.PoisonQueue(pub, "poison")
	require.NoError(t, err)
	router.AddMiddleware(middleware.CorrelationID)

	var calls sync.Map // uuid -> *atomic.Int32
	count := func(uuid string) int32 {
		v, _ := calls.LoadOrStore(uuid, new(atomic.Int32))
		return v.(*atomic.Int32).Add(1)
	}
	work := func(msg *message.Message) ([]*message.Message, error) {
		count(msg.UUID)
		switch string(msg.Payload) {
		case "panic":
			panic("handler panicked")
		case "fail":
			return nil, errors.New("handler failed")
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, msg.Payload)}, nil
	}
	retry := middleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}
	h := router.AddHandler("guarded", "in", sub, "out", pub, work)
	h.AddMiddleware(poisonQueue, retry.Middleware, middleware.Recoverer)
	router.AddConsumerHandler("bare", "in-bare", sub, func(msg *message.Message) error {
		count(msg.UUID)
		return errors.New("bare handler failed")
	})
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	send := func(topic, uuid, payload, corr string) {
		m := message.NewMessage(uuid, []byte(payload))
		middleware.SetCorrelationID(corr, m)
		require.NoError(t, pub.Publish(topic, m))
	}
	send("in", "ok", "ok", "c-ok")
	send("in", "fail", "fail", "c-fail")
	send("in", "panic", "panic", "c-panic")
	send("in-bare", "bare", "x", "c-bare")

	poisonCh, err := observe.Subscribe(ctx, "poison")
	require.NoError(t, err)
	outCh, err := observe.Subscribe(ctx, "out")
	require.NoError(t, err)

	out := receive(t, outCh, wait)
	require.Equal(t, "out-ok", out.UUID)
	require.Equal(t, "c-ok", middleware.MessageCorrelationID(out))
	out.Ack()

	poisoned := map[string]*message.Message{}
	for range 3 {
		m := receive(t, poisonCh, wait)
		poisoned[m.UUID] = m
		m.Ack()
	}
	for _, id := range []string{"fail", "panic"} {
		m := poisoned[id]
		require.NotNil(t, m, id)
		require.Equal(t, "in", m.Metadata.Get(middleware.PoisonedTopicKey), id)
		require.NotEmpty(t, m.Metadata.Get(middleware.ReasonForPoisonedKey), id)
		require.Equal(t, "c-"+id, middleware.MessageCorrelationID(m), id)
		require.Equal(t, "1", m.Metadata.Get(pubsub.AttemptKey), "PoisonQueue acked the first delivery")
		v, _ := calls.Load(id)
		require.EqualValues(t, 3, v.(*atomic.Int32).Load(), "one call and two retries of %s", id)
	}
	bare := poisoned["bare"]
	require.NotNil(t, bare)
	require.Equal(t, "in-bare", bare.Metadata.Get(middleware.PoisonedTopicKey))
	require.Contains(t, bare.Metadata.Get(middleware.ReasonForPoisonedKey), "attempt 2 of 2")
	require.Equal(t, "c-bare", middleware.MessageCorrelationID(bare))
	v, _ := calls.Load("bare")
	require.EqualValues(t, 2, v.(*atomic.Int32).Load(), "delivered twice (MaxAttempts 2)")
	require.NoError(t, router.Close())
}
