package pubsub_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
)

// BenchmarkDrain publishes b.N messages (at least 2,000, in Publish calls
// of 100) with no subscriber running, then reports how fast one subscriber
// receives and acks them all (msg/s), with the default MaxBatch (64, the
// maximum), with 1 and with 32 (the default before issue 15's drain work).
// Compare them in one run:
//
//	go test -run '^$' -bench Drain -benchtime 5000x -count 3 ./events/pubsub/
func BenchmarkDrain(b *testing.B) {
	for _, c := range []struct {
		name     string
		maxBatch int
	}{{"default", 0}, {"MaxBatch1", 1}, {"MaxBatch32", 32}} {
		b.Run(c.name, func(b *testing.B) {
			pool, schema := newSchema(b)
			pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: schema, Logger: watermill.NopLogger{}})
			require.NoError(b, err)
			defer pub.Close()
			sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema, MaxBatch: c.maxBatch, Logger: watermill.NopLogger{}})
			require.NoError(b, err)
			defer sub.Close()
			require.NoError(b, sub.SubscribeInitialize("drain"))
			n := max(b.N, 2000)
			for sent := 0; sent < n; sent += 100 {
				msgs := make([]*message.Message, min(100, n-sent))
				for i := range msgs {
					msgs[i] = message.NewMessage(watermill.NewUUID(), []byte("x"))
				}
				require.NoError(b, pub.Publish("drain", msgs...))
			}
			b.ResetTimer()
			start := time.Now()
			ch, err := sub.Subscribe(context.Background(), "drain")
			require.NoError(b, err)
			for range n {
				select {
				case m := <-ch:
					m.Ack()
				case <-time.After(time.Minute):
					b.Fatal("no message within a minute")
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msg/s")
		})
	}
}
