package amqpbridge_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events"
	"github.com/pgwake/pgwake/events/amqpbridge"
)

func msg(t *testing.T, id int64) *message.Message {
	m, err := events.NewMessage("pgwake", events.Event{ID: id, JobID: id, Type: events.TypeEnqueued, At: time.Now()}, pglogrepl.LSN(id))
	require.NoError(t, err)
	return m
}

// A nack (a queue full with x-overflow reject-publish) and an exchange
// deleted under the publisher fail the publish, so the stream retries it;
// once a queue takes the message again it is stored: nothing confirmed is
// missing from the queue.
func TestNackAndDeletedExchangeFailThePublish(t *testing.T) {
	t.Parallel()
	topic := "pgwake_test_" + randomName()
	qn := topic + "_q"
	cleanupAMQP(t, qn, topic)
	conn, err := amqp.Dial(amqpURL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	pub, err := amqpbridge.NewPublisher(amqpbridge.Config{URL: amqpURL(), ConfirmTimeout: 3 * time.Second})
	require.NoError(t, err)
	defer pub.Close()
	// first publish declares the exchange; no queue yet
	require.ErrorIs(t, pub.Publish(topic, msg(t, 1)), amqpbridge.ErrNoQueue)
	_, err = ch.QueueDeclare(qn, false, true, false, false, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(qn, "", topic, false, nil))
	require.Error(t, pub.Publish(topic, msg(t, 1), msg(t, 2), msg(t, 3)), "the third is nacked")
	_, err = ch.QueuePurge(qn, false)
	require.NoError(t, err)
	require.NoError(t, pub.Publish(topic, msg(t, 3)))
	require.NoError(t, ch.ExchangeDelete(topic, false, false))
	require.Error(t, pub.Publish(topic, msg(t, 4)), "exchange deleted: the channel closes")
	require.ErrorIs(t, pub.Publish(topic, msg(t, 4)), amqpbridge.ErrNoQueue, "declared again, unbound")
	require.NoError(t, ch.QueueBind(qn, "", topic, false, nil))
	require.NoError(t, pub.Publish(topic, msg(t, 4)))
	q, err := ch.QueueDeclarePassive(qn, false, true, false, false, amqp.Table{"x-max-length": int32(2), "x-overflow": "reject-publish"})
	require.NoError(t, err)
	require.Equal(t, 2, q.Messages, "3 and 4")
}
