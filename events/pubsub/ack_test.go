package pubsub_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// An Ack after a statement failed in the message's transaction is the
// consumer's decision: the message is not delivered again and its job ends
// cancelled with ErrAckedAfterFailedStatement (its writes could not commit).
// Before, the queue took it for a failed attempt and delivered the message
// again: behind Watermill's PoisonQueue middleware, which Acks after
// publishing the poison copy, 205 copies in 3 s; on the last delivery with
// PoisonTopic, the message failed without reaching the poison topic.
func TestAckAfterAFailedStatement(t *testing.T) {
	t.Run("PoisonQueue middleware", func(t *testing.T) {
		pool, schema := newSchema(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		uniq := sqlident.Quote(schema, "uniq")
		_, err := pool.Exec(ctx, `CREATE TABLE `+uniq+` (id int PRIMARY KEY); INSERT INTO `+uniq+` VALUES (1)`)
		require.NoError(t, err)
		pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
		sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, NackBackoff: 10 * time.Millisecond})
		observe := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "observer"})
		require.NoError(t, observe.SubscribeInitialize("poison"))
		router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
		require.NoError(t, err)
		poisonQueue, err := middleware.PoisonQueue(pub, "poison")
		require.NoError(t, err)
		var calls atomic.Int32
		h := router.AddConsumerHandler("h", "in", sub, func(msg *message.Message) error {
			calls.Add(1)
			tx, _ := pubsub.TxFromContext(msg.Context())
			_, err := tx.Exec(msg.Context(), `INSERT INTO `+uniq+` VALUES (1)`)
			return err // duplicate key
		})
		h.AddMiddleware(poisonQueue)
		done := make(chan struct{})
		go func() { defer close(done); _ = router.Run(ctx) }()
		<-router.Running()
		require.NoError(t, pub.Publish("in", message.NewMessage("dup", []byte("1"))))
		waitFor(t, wait, "the message's job ended", func() bool {
			return countJobs(t, pool, schema, `payload->>'topic' = 'in' AND state = 'cancelled' AND last_error LIKE '%acked after a statement%'`) == 1
		})
		time.Sleep(300 * time.Millisecond) // 30 NackBackoffs: a redelivery would show
		require.NoError(t, router.Close())
		<-done
		require.Equal(t, 1, countJobs(t, pool, schema, "payload->>'topic' = 'poison'"), "poisoned once")
		require.EqualValues(t, 1, calls.Load(), "delivered once")
	})
	for _, leased := range []bool{false, true} {
		t.Run(fmt.Sprint("last delivery, PoisonTopic, leased=", leased), func(t *testing.T) {
			pool, schema := newSchema(t)
			ctx := context.Background()
			pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 1})
			sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, PoisonTopic: "poison", Leased: leased})
			ch, err := sub.Subscribe(ctx, "in")
			require.NoError(t, err)
			require.NoError(t, pub.Publish("in", message.NewMessage("m", nil)))
			m := receive(t, ch, wait)
			tx, _ := pubsub.TxFromContext(m.Context())
			_, err = tx.Exec(m.Context(), `SELECT 1/0`)
			require.Error(t, err)
			m.Ack()
			waitFor(t, wait, "the message's job ended", func() bool {
				return countJobs(t, pool, schema, `payload->>'topic' = 'in' AND state = 'cancelled'`) == 1
			})
		})
	}
}

// TxAttempt inside Retry: a failed try's writes roll back, and a failed
// statement does not fail the tries after it; only the succeeding try's
// write commits. Without it, both tries' rows committed.
func TestTxAttemptRollsBackAFailedTry(t *testing.T) {
	for _, withTxAttempt := range []bool{true, false} {
		t.Run(fmt.Sprint("TxAttempt=", withTxAttempt), func(t *testing.T) {
			pool, schema := newSchema(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			w := sqlident.Quote(schema, "w")
			_, err := pool.Exec(ctx, `CREATE TABLE `+w+` (v text)`)
			require.NoError(t, err)
			pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
			sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
			router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
			require.NoError(t, err)
			var calls atomic.Int32
			h := router.AddConsumerHandler("h", "in", sub, func(msg *message.Message) error {
				n := calls.Add(1)
				tx, _ := pubsub.TxFromContext(msg.Context())
				if _, err := tx.Exec(msg.Context(), `INSERT INTO `+w+` VALUES ($1)`, fmt.Sprint("try", n)); err != nil {
					return err
				}
				switch n {
				case 1:
					return errors.New("transient")
				case 2:
					_, err := tx.Exec(msg.Context(), `SELECT 1/0`) // a failed statement
					return err
				}
				return nil
			})
			h.AddMiddleware((&middleware.Retry{MaxRetries: 3, InitialInterval: time.Millisecond}).Middleware)
			if withTxAttempt {
				h.AddMiddleware(pubsub.TxAttempt)
			}
			done := make(chan struct{})
			go func() { defer close(done); _ = router.Run(ctx) }()
			<-router.Running()
			require.NoError(t, pub.Publish("in", message.NewMessage("x", []byte("1"))))
			if !withTxAttempt {
				// The failed statement of try 2 aborts the transaction: tries
				// 3 and 4 fail on it, and the delivery is Nacked.
				waitFor(t, wait, "four tries", func() bool { return calls.Load() >= 4 })
				require.NoError(t, router.Close())
				<-done
				require.Zero(t, countJobs(t, pool, schema, "state = 'succeeded'"))
				return
			}
			waitFor(t, wait, "acked", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == 1 })
			require.NoError(t, router.Close())
			<-done
			var vs []string
			rows, err := pool.Query(ctx, `SELECT v FROM `+w+` ORDER BY v`)
			require.NoError(t, err)
			for rows.Next() {
				var v string
				require.NoError(t, rows.Scan(&v))
				vs = append(vs, v)
			}
			require.NoError(t, rows.Err())
			require.Equal(t, []string{"try3"}, vs, "only the succeeding try's write committed")
			require.EqualValues(t, 3, calls.Load())
		})
	}
}
