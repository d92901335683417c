package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
)

// A Close while the last allowed delivery of a message is out loses
// nothing: that delivery is given back uncounted, and a later subscriber
// gets the message. Before, it ended failed (attempts 1 of 1) and was never
// delivered again, against docs/watermill.md's "nothing is lost".
func TestCloseOnTheLastDeliveryLosesNothing(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 1})
	sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema, CloseTimeout: 50 * time.Millisecond, MaxBatch: 1})
	require.NoError(t, err)
	require.NoError(t, sub.SubscribeInitialize("t"))
	require.NoError(t, pub.Publish("t", message.NewMessage("only", []byte("x"))))
	ch, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.Equal(t, "only", receive(t, ch, wait).UUID)
	require.NoError(t, sub.Close()) // a deploy restarts the consumer while the message is out
	require.Equal(t, 1, countJobs(t, pool, schema, "state = 'pending' AND attempts = 0"), "given back, uncounted")

	again := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	ch, err = again.Subscribe(ctx, "t")
	require.NoError(t, err)
	m := receive(t, ch, wait)
	require.Equal(t, "only", m.UUID)
	m.Ack()
	waitFor(t, wait, "acked", func() bool { return countJobs(t, pool, schema, "state = 'succeeded'") == 1 })
}

// An AckTimeout on the last delivery counts as a Nack, as documented: with
// a PoisonTopic the message goes there. Before, the job just failed.
func TestAckTimeoutOnTheLastDeliveryPoisons(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	ctx := context.Background()
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema, MaxAttempts: 1})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, AckTimeout: 200 * time.Millisecond,
		CloseTimeout: 50 * time.Millisecond, PoisonTopic: "poison", MaxBatch: 1})
	poison := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, ConsumerGroup: "ops"})
	require.NoError(t, poison.SubscribeInitialize("poison"))
	ch, err := sub.Subscribe(ctx, "t")
	require.NoError(t, err)
	require.NoError(t, pub.Publish("t", message.NewMessage("slow", nil)))
	m := receive(t, ch, wait)
	<-m.Context().Done() // never acked: the AckTimeout cancels it
	waitFor(t, wait, "the delivery failed for good", func() bool {
		return countJobs(t, pool, schema, "payload->>'topic' = 't' AND state = 'failed'") == 1
	})
	pch, err := poison.Subscribe(ctx, "poison")
	require.NoError(t, err)
	pm := receive(t, pch, wait)
	require.Equal(t, "slow", pm.UUID)
	require.Contains(t, pm.Metadata.Get(pubsub.ReasonPoisonedKey), "on attempt 1 of 1")
	pm.Ack()
}
