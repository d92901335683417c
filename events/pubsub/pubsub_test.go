package pubsub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/promreg"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/queue"
)

const wait = 30 * time.Second

func TestRoundTripPreservesMessage(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})

	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i) // NUL, invalid UTF-8, everything
	}
	msgs := []*message.Message{
		message.NewMessage(watermill.NewUUID(), binary),
		message.NewMessage("not-a-uuid ' \"; DROP TABLE x; --", []byte(`{"json":"but opaque"}`)),
		message.NewMessage(watermill.NewUUID(), nil),
		message.NewMessage("", []byte{}),
	}
	msgs[0].Metadata.Set("k", "v")
	msgs[0].Metadata.Set("unicode ключ", "значение ✓ \"quoted\" \\ ;")
	msgs[1].Metadata.Set("", "empty key")

	require.NoError(t, pub.Publish("orders", msgs...))
	ch, err := sub.Subscribe(context.Background(), "orders")
	require.NoError(t, err)
	for _, want := range msgs {
		got := receive(t, ch, wait)
		require.Equal(t, want.UUID, got.UUID)
		require.Equal(t, want.Payload, got.Payload) // nil stays nil, empty stays empty
		require.Equal(t, "1", got.Metadata.Get(pubsub.AttemptKey))
		delete(got.Metadata, pubsub.AttemptKey)
		delete(got.Metadata, pubsub.MaxAttemptsKey)
		require.Equal(t, want.Metadata, got.Metadata)
		require.True(t, got.Ack())
	}
	waitFor(t, wait, "jobs succeeded", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == len(msgs) })
}

func TestPublishRejectsUnstorableMessagesBeforeWriting(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxJobBytes: 4096})

	good := message.NewMessage(watermill.NewUUID(), []byte("x"))
	badMeta := message.NewMessage(watermill.NewUUID(), []byte("x"))
	badMeta.Metadata.Set("k", "\xff\xfe")
	nulMeta := message.NewMessage(watermill.NewUUID(), []byte("x"))
	nulMeta.Metadata.Set("k\x00", "v")
	badUUID := message.NewMessage("a\x00b", []byte("x"))
	big := message.NewMessage(watermill.NewUUID(), make([]byte, 4096))

	for _, tc := range []struct {
		name string
		msgs []*message.Message
		want error
	}{
		{"invalid UTF-8 metadata", []*message.Message{good, badMeta}, pubsub.ErrInvalidMessage},
		{"NUL in metadata key", []*message.Message{good, nulMeta}, pubsub.ErrInvalidMessage},
		{"NUL in UUID", []*message.Message{good, badUUID}, pubsub.ErrInvalidMessage},
		{"nil message", []*message.Message{good, nil}, pubsub.ErrInvalidMessage},
		{"too large", []*message.Message{good, big}, queue.ErrPayloadTooLarge},
	} {
		err := pub.Publish("t", tc.msgs...)
		require.ErrorIs(t, err, tc.want, tc.name)
		var me *pubsub.MessageError
		require.ErrorAs(t, err, &me, tc.name)
		require.Equal(t, 1, me.Index, tc.name)

		tx, err := pool.Begin(context.Background())
		require.NoError(t, err)
		require.ErrorIs(t, pub.PublishTx(context.Background(), tx, "t", tc.msgs...), tc.want, tc.name)
		require.NoError(t, tx.Rollback(context.Background()))
	}
	require.Equal(t, 0, countJobs(t, pool, schema, "true"))
}

func TestTopicNames(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})

	// Rejected, with ErrInvalidTopic, by Publish, Subscribe and QueueName;
	// nothing is written.
	for _, topic := range []string{"", "a\x00b", "tab\tchar", "bad\xffutf8", strings.Repeat("x", pubsub.MaxTopicLen+1)} {
		require.ErrorIs(t, pub.Publish(topic, message.NewMessage("1", nil)), pubsub.ErrInvalidTopic, "%q", topic)
		_, err := sub.Subscribe(context.Background(), topic)
		require.ErrorIs(t, err, pubsub.ErrInvalidTopic, "%q", topic)
		require.ErrorIs(t, sub.SubscribeInitialize(topic), pubsub.ErrInvalidTopic, "%q", topic)
		_, err = pubsub.QueueName(topic, "")
		require.ErrorIs(t, err, pubsub.ErrInvalidTopic, "%q", topic)
	}
	require.Equal(t, 0, countJobs(t, pool, schema, "true"))

	// Accepted and mapped to distinct, valid queue names; each topic gets
	// exactly its own messages.
	topics := []string{
		"orders", "Orders", "ORDERS", "orders;", "orders'", `or"ders`, "'; DROP TABLE jobs; --",
		"заказы", "注文", "🚀", "with space", "a.b-c_d", strings.Repeat("long", 16), strings.Repeat("long", 16) + "!",
		strings.Repeat("é", pubsub.MaxTopicLen/2), "_", "-", ".",
	}
	seen := map[string]string{}
	for _, topic := range topics {
		q, err := pubsub.QueueName(topic, "")
		require.NoError(t, err)
		require.NoError(t, queue.ValidateQueue(q), "%q -> %q", topic, q)
		require.True(t, strings.HasPrefix(q, "wm."))
		if prev, dup := seen[q]; dup {
			t.Fatalf("topics %q and %q both map to %q", prev, topic, q)
		}
		seen[q] = topic
		again, _ := pubsub.QueueName(topic, "")
		require.Equal(t, q, again, "mapping must be deterministic")
		qg, err := pubsub.QueueName(topic, "Group 'x'")
		require.NoError(t, err)
		require.NoError(t, queue.ValidateQueue(qg))
		require.NotEqual(t, q, qg)
	}
	q, _ := pubsub.QueueName("Orders.Created", "billing")
	require.Regexp(t, `^wm\.orders_created\.billing\.[0-9a-f]{16}$`, q)
	_, err := pubsub.QueueName("t", "bad\x00group")
	require.ErrorIs(t, err, pubsub.ErrInvalidGroup)
	_, err = pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{ConsumerGroup: strings.Repeat("g", 256)})
	require.ErrorIs(t, err, pubsub.ErrInvalidGroup)

	for i, topic := range topics {
		require.NoError(t, pub.Publish(topic, message.NewMessage(topic, []byte{byte(i)})))
	}
	for _, topic := range topics {
		ch, err := sub.Subscribe(context.Background(), topic)
		require.NoError(t, err)
		m := receive(t, ch, wait)
		require.Equal(t, topic, m.UUID)
		m.Ack()
	}
	waitFor(t, wait, "all succeeded", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == len(topics) })
}

func TestPublishTx(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	ctx := context.Background()
	ch, err := sub.Subscribe(ctx, "outbox")
	require.NoError(t, err)

	// Rolled back: nothing exists, nothing is delivered.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, pub.PublishTx(ctx, tx, "outbox", message.NewMessage("rolled-back", nil)))
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, countJobs(t, pool, schema, "true"))

	// Committed through the message.Publisher view: delivered.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	var wp message.Publisher = pub.WithTx(ctx, tx)
	require.NoError(t, wp.Publish("outbox", message.NewMessage("committed", nil)))
	require.NoError(t, wp.Close())
	require.Equal(t, 0, countJobs(t, pool, schema, "true"), "invisible before commit")
	require.NoError(t, tx.Commit(ctx))
	m := receive(t, ch, wait)
	require.Equal(t, "committed", m.UUID)
	m.Ack()
	require.ErrorIs(t, pub.PublishTx(ctx, nil, "outbox"), pubsub.ErrInvalidConfig)
}

func TestAckCommitsHandlerWritesNackRollsBack(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	effects := sqlident.Quote(schema, "effects")
	_, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (uuid text, attempt int)`)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, Registerer: reg})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, NackBackoff: 10 * time.Millisecond, Registerer: reg})
	ch, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	// A second subscription shares the registry.
	_, err = sub.Subscribe(ctx, "other")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("m1", nil)))

	write := func(m *message.Message, attempt int) {
		tx, ok := pubsub.TxFromContext(m.Context())
		require.True(t, ok)
		_, err := tx.Exec(m.Context(), `INSERT INTO `+effects+` VALUES ($1, $2)`, m.UUID, attempt)
		require.NoError(t, err)
		require.ErrorIs(t, tx.Commit(m.Context()), queue.ErrTxOwned)
	}
	// Two Nacks: their writes roll back, the message comes again.
	for attempt := 1; attempt <= 2; attempt++ {
		m := receive(t, ch, wait)
		require.Equal(t, "m1", m.UUID)
		write(m, attempt)
		require.True(t, m.Nack())
		select {
		case <-m.Context().Done():
		case <-time.After(wait):
			t.Fatal("message context not cancelled after Nack")
		}
	}
	m := receive(t, ch, wait)
	write(m, 3)
	require.True(t, m.Ack())
	waitFor(t, wait, "job succeeded", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == 1 })
	var got []int
	rows, err := pool.Query(ctx, `SELECT attempt FROM `+effects)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Equal(t, []int{3}, got, "only the acked attempt's write is kept")
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT attempts FROM `+sqlident.Quote(schema, "jobs")).Scan(&attempts))
	require.Equal(t, 3, attempts)
	// The events log tells the story: two retries, one success.
	var types []string
	rows, err = pool.Query(ctx, `SELECT type FROM `+sqlident.Quote(schema, "events")+` ORDER BY id`)
	require.NoError(t, err)
	types, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"enqueued", "retry_scheduled", "retry_scheduled", "succeeded"}, types)

	// The same story in the metrics: two Nacks, one Ack, one message in.
	q, err := pubsub.QueueName("t", "")
	require.NoError(t, err)
	// The outcome is counted after the Ack's commit.
	waitFor(t, wait, "outcome counted", func() bool {
		return metricSum(t, reg, "pgwake_worker_jobs_total", "queue", q, "outcome", "succeeded") >= 1
	})
	require.Equal(t, 2.0, metricSum(t, reg, "pgwake_worker_jobs_total", "queue", q, "outcome", "retry"))
	require.Equal(t, 1.0, metricSum(t, reg, "pgwake_worker_jobs_total", "queue", q, "outcome", "succeeded"))
	require.Equal(t, 1.0, metricSum(t, reg, "pgwake_queue_enqueued_total", "queue", q))
	require.Equal(t, 3.0, metricSum(t, reg, "pgwake_worker_claims_total", "queue", q))
}

// metricSum sums the samples of name whose labels match the given
// name/value pairs.
func metricSum(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	v, err := promreg.Sum(reg, name, labels...)
	require.NoError(t, err)
	return v
}

func TestMaxAttemptsFailsMessage(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 2})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, NackBackoff: -1})
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("m", nil)))
	receive(t, ch, wait).Nack()
	receive(t, ch, wait).Nack()
	waitFor(t, wait, "job failed", func() bool { return countJobs(t, pool, schema, "state = 'failed'") == 1 })
	requireNothing(t, ch, 300*time.Millisecond)

	// Default: unlimited.
	pub2 := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	require.NoError(t, pub2.Publish("t", message.NewMessage("m2", nil)))
	require.Equal(t, 1, countJobs(t, pool, schema, "max_attempts = $1", pubsub.Unlimited))
	_, err = pubsub.NewPublisher(pool, pubsub.PublisherConfig{MaxAttempts: -1})
	require.ErrorIs(t, err, pubsub.ErrInvalidConfig)
}

// One message is out per subscription: the next comes after Ack.
func TestOneMessageOutUntilAck(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("1", nil), message.NewMessage("2", nil)))
	m1 := receive(t, ch, wait)
	require.Equal(t, "1", m1.UUID)
	requireNothing(t, ch, 300*time.Millisecond)
	m1.Ack()
	m2 := receive(t, ch, wait)
	require.Equal(t, "2", m2.UUID, "one subscriber without Nacks gets publish order")
	m2.Ack()
}

func TestConsumerGroups(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})

	// Before any group registers, messages go to the default group.
	require.NoError(t, pub.Publish("t", message.NewMessage("early", nil)))
	def := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	a1 := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "a"})
	a2 := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "a"})
	b := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "B 'b'"})
	for _, s := range []*pubsub.Subscriber{a1, b} {
		require.NoError(t, s.SubscribeInitialize("t"))
	}
	// Registered groups only: the default group is not registered, so the
	// early message stays its only one.
	const n = 40
	var msgs []*message.Message
	for i := range n {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), []byte{byte(i)}))
	}
	require.NoError(t, pub.Publish("t", msgs...))
	require.Equal(t, 1+2*n, countJobs(t, pool, schema, "true"), "1 early + n per group a and b")

	chDef, err := def.Subscribe(ctx, "t")
	require.NoError(t, err)
	m := receive(t, chDef, wait)
	require.Equal(t, "early", m.UUID)
	m.Ack()

	chA1, err := a1.Subscribe(ctx, "t")
	require.NoError(t, err)
	chA2, err := a2.Subscribe(ctx, "t")
	require.NoError(t, err)
	chB, err := b.Subscribe(ctx, "t")
	require.NoError(t, err)

	gotA := map[string]int{}
	fromA := map[int]int{}
	gotB := map[string]int{}
	for len(gotA) < n || len(gotB) < n {
		select {
		case m := <-chA1:
			gotA[m.UUID]++
			fromA[1]++
			m.Ack()
		case m := <-chA2:
			gotA[m.UUID]++
			fromA[2]++
			m.Ack()
		case m := <-chB:
			gotB[m.UUID]++
			m.Ack()
		case <-time.After(wait):
			t.Fatalf("group a has %d, group b %d of %d", len(gotA), len(gotB), n)
		}
	}
	for _, m := range msgs {
		require.Equal(t, 1, gotA[m.UUID])
		require.Equal(t, 1, gotB[m.UUID])
	}
	require.Equal(t, n, fromA[1]+fromA[2])
	requireNothing(t, chDef, 200*time.Millisecond)

	// RemoveGroup: b's pending messages are cancelled, later ones skip b.
	require.NoError(t, b.RemoveGroup(ctx, "t"))
	require.NoError(t, pub.Publish("t", message.NewMessage("late", nil)))
	select {
	case m = <-chA1:
	case m = <-chA2:
	case <-time.After(wait):
		t.Fatal("group a did not get the late message")
	}
	require.Equal(t, "late", m.UUID)
	m.Ack()
	requireNothing(t, chB, 200*time.Millisecond)
	qb, err := pubsub.QueueName("t", "B 'b'")
	require.NoError(t, err)
	require.Equal(t, n, countJobs(t, pool, schema, "queue = $1", qb), "no job for b after RemoveGroup")

	// RemoveGroup cancels what the group had not consumed.
	c := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "c"})
	require.NoError(t, c.SubscribeInitialize("t"))
	require.NoError(t, pub.Publish("t", message.NewMessage("for-c", nil)))
	select {
	case m = <-chA1:
	case m = <-chA2:
	case <-time.After(wait):
		t.Fatal("group a did not get its message")
	}
	m.Ack()
	require.NoError(t, c.RemoveGroup(ctx, "t"))
	require.Equal(t, 1, countJobs(t, pool, schema, "state = 'cancelled'"))
}

func TestCloseAndCancel(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema, CloseTimeout: 100 * time.Millisecond, NackBackoff: -1})
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("1", nil), message.NewMessage("2", nil)))

	// ctx cancel closes the channel; the message that was out is kept.
	sctx, cancel := context.WithCancel(ctx)
	ch, err := sub.Subscribe(sctx, "t")
	require.NoError(t, err)
	m := receive(t, ch, wait)
	require.Equal(t, "1", m.UUID)
	cancel()
	select {
	case <-m.Context().Done():
	case <-time.After(wait):
		t.Fatal("message context not cancelled by the subscription's end")
	}
	for range ch { // drain until closed
	}

	// Close: the unacked message's context is cancelled and the channel closes.
	ch, err = sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	m = receive(t, ch, wait)
	require.NoError(t, sub.Close())
	require.NoError(t, sub.Close())
	_, open := <-ch
	require.False(t, open)
	<-m.Context().Done()
	_, err = sub.Subscribe(ctx, "t")
	require.ErrorIs(t, err, pubsub.ErrClosed)

	// Nothing was lost: both messages are pending and come to a new subscriber.
	require.Equal(t, 2, countJobs(t, pool, schema, "state = 'pending'"))
	sub2 := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	ch, err = sub2.Subscribe(ctx, "t")
	require.NoError(t, err)
	seen := map[string]bool{}
	for len(seen) < 2 {
		m := receive(t, ch, wait)
		seen[m.UUID] = true
		m.Ack()
	}

	require.NoError(t, pub.Close())
	require.ErrorIs(t, pub.Publish("t", message.NewMessage("x", nil)), pubsub.ErrClosed)
	var closedErr error = pubsub.ErrClosed
	require.True(t, errors.Is(closedErr, pubsub.ErrClosed))
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	_, err := pubsub.NewPublisher(nil, pubsub.PublisherConfig{})
	require.ErrorIs(t, err, pubsub.ErrInvalidConfig)
	_, err = pubsub.NewSubscriber(nil, pubsub.SubscriberConfig{})
	require.ErrorIs(t, err, pubsub.ErrInvalidConfig)
	pool, _ := newSchema(t)
	for _, cfg := range []pubsub.SubscriberConfig{
		{Schema: "Bad-Schema"},
		{AckTimeout: -1},
		{CloseTimeout: -1},
		{PollInterval: time.Millisecond},
		{MaxBatch: -1},
		{MaxBatch: 65},
	} {
		_, err = pubsub.NewSubscriber(pool, cfg)
		require.ErrorIs(t, err, pubsub.ErrInvalidConfig, "%+v", cfg)
	}
	_, err = pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: "x;y"})
	require.ErrorIs(t, err, pubsub.ErrInvalidConfig)
}

func TestAckTimeoutRedelivers(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, AckTimeout: 200 * time.Millisecond, CloseTimeout: 50 * time.Millisecond, NackBackoff: -1})
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("slow", nil)))
	m := receive(t, ch, wait)
	select {
	case <-m.Context().Done(): // the ack timeout cancelled it
	case <-time.After(wait):
		t.Fatal("message context not cancelled after AckTimeout")
	}
	again := receive(t, ch, wait)
	require.Equal(t, "slow", again.UUID)
	require.True(t, again.Ack())
	waitFor(t, wait, "job succeeded", func() bool { return countJobs(t, pool, schema, "state = 'succeeded' AND attempts = 2") == 1 })
}

// MaxBatch > 1: every message still comes, Nacked ones again, and the
// handlers' writes of acked messages commit.
func TestMaxBatch(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	effects := sqlident.Quote(schema, "effects")
	_, err := pool.Exec(ctx, `CREATE TABLE `+effects+` (uuid text PRIMARY KEY)`)
	require.NoError(t, err)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, MaxBatch: 32, NackBackoff: -1})
	require.NoError(t, sub.SubscribeInitialize("t"))
	const n = 300
	var msgs []*message.Message
	for range n {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), nil))
	}
	require.NoError(t, pub.Publish("t", msgs...))
	ch, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	acked := map[string]bool{}
	nacked := map[string]bool{}
	for len(acked) < n {
		m := receive(t, ch, wait)
		tx, ok := pubsub.TxFromContext(m.Context())
		require.True(t, ok)
		_, err := tx.Exec(m.Context(), `INSERT INTO `+effects+` VALUES ($1)`, m.UUID)
		require.NoError(t, err)
		if len(nacked) < 20 && !nacked[m.UUID] {
			nacked[m.UUID] = true
			m.Nack()
			continue
		}
		require.False(t, acked[m.UUID], "acked message %s delivered again", m.UUID)
		acked[m.UUID] = true
		m.Ack()
	}
	waitFor(t, wait, "all succeeded", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == n })
	var effectsN int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+effects).Scan(&effectsN))
	require.Equal(t, n, effectsN, "one committed write per message: Nacked writes rolled back")
}
