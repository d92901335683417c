package pubsub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/pgtest"
)

// Watermill's TestReconnect scenario, with its publishers waited for before
// the comparison (the suite's version races with its own collector, see
// TestWatermillConformance): 10,000 messages from 100 publishers, the
// database restarted (pg_ctl restart -m fast) at a third and at half of
// them; a publish that fails is retried with the same message. Every
// message acknowledged to a publisher is delivered (at least once; a
// publish whose commit landed but whose answer was lost is retried and may
// deliver its message twice, under the same UUID), and nothing else is.
func TestReconnectLosesNothing(t *testing.T) {
	// The test binary's cluster, or with $TEST_DATABASE_URL a private one:
	// the test restarts it, so it always runs.
	cl := pgtest.RestartableCluster(t)
	c := &conformance{schemas: map[string]string{}}
	c.pool = pgtest.PoolOn(t, cl.URL, nil)
	pub, sub := c.pubSub(t, "")
	const topic = "reconnect"
	require.NoError(t, sub.(*pubsub.Subscriber).SubscribeInitialize(topic))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	msgs, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	const messages, publishers = 10000, 100
	restartAt := map[int]bool{messages / 3: true, messages / 2: true}
	next := make(chan int)
	var restarts sync.WaitGroup
	go func() {
		defer close(next)
		for i := range messages {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
			if restartAt[i] {
				restarts.Go(func() {
					if err := cl.Restart(ctx, "fast"); err != nil {
						t.Errorf("restart the test cluster: %v", err)
					}
				})
			}
		}
	}()
	var mu sync.Mutex
	published := map[string]bool{}
	var pubs sync.WaitGroup
	for range publishers {
		pubs.Go(func() {
			for range next {
				m := message.NewMessage(watermill.NewUUID(), []byte("x"))
				for pub.Publish(topic, m) != nil {
					if ctx.Err() != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				mu.Lock()
				published[m.UUID] = true
				mu.Unlock()
			}
		})
	}

	received := map[string]bool{}
	for len(received) < messages {
		select {
		case m := <-msgs:
			received[m.UUID] = true
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("%d of %d messages received", len(received), messages)
		}
	}
	pubs.Wait()
	restarts.Wait()
	require.Len(t, published, messages)
	for id := range received {
		require.True(t, published[id], "message %s received, never published", id)
	}
}
