package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
)

func TestTmpSpeed(t *testing.T) {
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	require.NoError(t, sub.SubscribeInitialize("t"))
	start := time.Now()
	for i := 0; i < 30; i++ {
		var ms []*message.Message
		for j := 0; j < 100; j++ {
			ms = append(ms, message.NewMessage("x", nil))
		}
		require.NoError(t, pub.Publish("t", ms...))
	}
	t.Logf("publish 3000 in batches: %s", time.Since(start))
	start = time.Now()
	for i := 0; i < 1000; i++ {
		require.NoError(t, pub.Publish("t", message.NewMessage("x", nil)))
	}
	t.Logf("publish 1000 singly: %s", time.Since(start))
	ch, err := sub.Subscribe(context.Background(), "t")
	require.NoError(t, err)
	start = time.Now()
	for i := 0; i < 4000; i++ {
		(<-ch).Ack()
	}
	t.Logf("consume 4000: %s", time.Since(start))
}

func TestTmpPublishConcurrent(t *testing.T) {
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	require.NoError(t, sub.SubscribeInitialize("t"))
	for _, withSub := range []bool{false, true} {
		if withSub {
			ch, err := sub.Subscribe(context.Background(), "t")
			require.NoError(t, err)
			go func() {
				for m := range ch {
					m.Ack()
				}
			}()
		}
		start := time.Now()
		done := make(chan struct{})
		for g := 0; g < 100; g++ {
			go func() {
				for i := 0; i < 30; i++ {
					_ = pub.Publish("t", message.NewMessage("x", nil))
				}
				done <- struct{}{}
			}()
		}
		for g := 0; g < 100; g++ {
			<-done
		}
		t.Logf("withSub=%v publish 3000 from 100 goroutines: %s", withSub, time.Since(start))
	}
}
