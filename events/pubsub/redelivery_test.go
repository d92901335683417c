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
	"github.com/jackc/pgx/v5"
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

// NackWith (or SetNackOutcome, then a Nack by whoever sends it) carries the
// queue's outcome controls: a Snooze is delivered again without counting
// the delivery, also on the last one, and is never poisoned; a Cancel ends
// the job cancelled with no redelivery and no poison message; a RetryAfter
// is delivered again after its delay with the next attempt and its error as
// the job's last error; a plain error is a Nack whose reason it is, in the
// poison message too. A message pgwake did not deliver, or one already
// acked, is refused with ErrNotDelivered.
// Both execution modes: held (the default) and leased.
func TestNackWithOutcomes(t *testing.T) {
	t.Parallel()
	t.Run("held", func(t *testing.T) { t.Parallel(); testNackWithOutcomes(t, false) })
	t.Run("leased", func(t *testing.T) { t.Parallel(); testNackWithOutcomes(t, true) })
}

func testNackWithOutcomes(t *testing.T, leased bool) {
	pool, schema := newSchema(t)
	ctx := context.Background()
	once := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 1})
	twice := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 2})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, PoisonTopic: "dead", NackBackoff: time.Hour, Leased: leased})
	ops := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "ops"})
	require.NoError(t, ops.SubscribeInitialize("dead"))
	subscribe := func(topic string) <-chan *message.Message {
		ch, err := sub.Subscribe(ctx, topic)
		require.NoError(t, err)
		return ch
	}
	lastError := func(topic string) (state, lastErr string) {
		require.NoError(t, pool.QueryRow(ctx, `SELECT state, coalesce(last_error, '') FROM `+schema+`.jobs WHERE payload->>'topic' = $1`,
			topic).Scan(&state, &lastErr))
		return state, lastErr
	}
	eventTypes := func(topic string) []string {
		rows, err := pool.Query(ctx, `SELECT e.type FROM `+schema+`.events e JOIN `+schema+`.jobs j ON j.id = e.job_id
			WHERE j.payload->>'topic' = $1 AND e.type <> 'started' ORDER BY e.id`, topic) // started: leased only
		require.NoError(t, err)
		types, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return types
	}

	// Snooze on the only delivery: delivered again as attempt 1, then acked.
	snoozes := subscribe("snooze")
	require.NoError(t, once.Publish("snooze", message.NewMessage("s1", nil)))
	m := receive(t, snoozes, wait)
	require.NoError(t, pubsub.NackWith(m, queue.Snooze(50*time.Millisecond)))
	m = receive(t, snoozes, wait)
	require.Equal(t, "1", m.Metadata.Get(pubsub.AttemptKey), "a snoozed delivery is not counted")
	require.True(t, m.Ack())
	waitFor(t, wait, "snoozed message acked", func() bool { state, _ := lastError("snooze"); return state == "succeeded" })
	require.Equal(t, []string{"enqueued", "snoozed", "succeeded"}, eventTypes("snooze"))

	// Cancel on the last delivery, set before a Nack sent by someone else.
	cancels := subscribe("cancel")
	require.NoError(t, once.Publish("cancel", message.NewMessage("c1", nil)))
	m = receive(t, cancels, wait)
	require.NoError(t, pubsub.SetNackOutcome(m, queue.Cancel(errors.New("order withdrawn"))))
	require.True(t, m.Nack())
	waitFor(t, wait, "cancelled", func() bool { state, _ := lastError("cancel"); return state == "cancelled" })
	_, lastErr := lastError("cancel")
	require.Contains(t, lastErr, "order withdrawn")
	require.Equal(t, []string{"enqueued", "cancelled"}, eventTypes("cancel"))

	// RetryAfter: the next attempt comes after its delay, not NackBackoff's hour.
	retries := subscribe("retry")
	require.NoError(t, twice.Publish("retry", message.NewMessage("r1", nil)))
	m = receive(t, retries, wait)
	nacked := time.Now()
	require.NoError(t, pubsub.NackWith(m, queue.RetryAfter(300*time.Millisecond, errors.New("partner down"))))
	m = receive(t, retries, wait)
	require.GreaterOrEqual(t, time.Since(nacked), 300*time.Millisecond, "delivered again before the RetryAfter delay")
	require.Equal(t, "2", m.Metadata.Get(pubsub.AttemptKey))
	_, lastErr = lastError("retry")
	require.Contains(t, lastErr, "partner down")
	require.Contains(t, lastErr, pubsub.ErrNacked.Error())

	// A plain error on the last delivery: poisoned, with it as the reason.
	require.NoError(t, pubsub.NackWith(m, errors.New("schema mismatch")))
	dead, err := ops.Subscribe(ctx, "dead")
	require.NoError(t, err)
	p := receive(t, dead, wait)
	require.Equal(t, "r1", p.UUID)
	require.Contains(t, p.Metadata.Get(pubsub.ReasonPoisonedKey), "schema mismatch on attempt 2 of 2")
	require.True(t, p.Ack())
	requireNothing(t, dead, 200*time.Millisecond) // the snooze and the cancel sent nothing there

	require.ErrorIs(t, pubsub.NackWith(message.NewMessage("x", nil), queue.Snooze(time.Second)), pubsub.ErrNotDelivered)
	require.NoError(t, once.Publish("snooze", message.NewMessage("s2", nil)))
	m = receive(t, snoozes, wait)
	require.True(t, m.Ack())
	waitFor(t, wait, "acked", func() bool { return m.Context().Err() != nil })
	require.ErrorIs(t, pubsub.SetNackOutcome(m, queue.Snooze(time.Second)), pubsub.ErrNotDelivered)
}
