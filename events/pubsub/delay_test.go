package pubsub_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/internal/sqlident"
)

// Messages published with Watermill's delay metadata (delay.Message, or
// delay.WithContext through delay.NewPublisher) become jobs due at the
// delay's time and are delivered no earlier; undelayed ones at once.
func TestDelayedMessages(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	pub := newPublisher(t, pool, pubsub.PublisherConfig{Schema: schema})
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema})
	ch, err := sub.Subscribe(context.Background(), "delayed")
	require.NoError(t, err)

	dpub, err := delay.NewPublisher(pub, delay.PublisherConfig{AllowNoDelay: true})
	require.NoError(t, err)

	until := time.Now().Add(1500 * time.Millisecond)
	byMeta := message.NewMessage("until", nil)
	delay.Message(byMeta, delay.Until(until))
	byCtx := message.NewMessage("for", nil)
	byCtx.SetContext(delay.WithContext(context.Background(), delay.For(700*time.Millisecond)))
	forDue := time.Now().Add(700 * time.Millisecond)
	now := message.NewMessage("now", nil)
	require.NoError(t, dpub.Publish("delayed", byMeta, byCtx, now))

	// The jobs' run_after is the delay's time, to the millisecond (not the
	// whole second delay.Message writes).
	var due time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT run_after FROM `+sqlident.Quote(schema, "jobs")+
		` WHERE payload->>'uuid' = 'until'`).Scan(&due))
	require.WithinDuration(t, until, due, 5*time.Millisecond)

	got := receive(t, ch, wait)
	require.Equal(t, "now", got.UUID)
	got.Ack()
	got = receive(t, ch, wait)
	require.Equal(t, "for", got.UUID)
	require.False(t, time.Now().Before(forDue.Add(-time.Millisecond)), "delivered before its delay")
	require.NotEmpty(t, got.Metadata.Get(delay.DelayedForKey), "delay metadata kept")
	got.Ack()
	got = receive(t, ch, wait)
	require.Equal(t, "until", got.UUID)
	require.False(t, time.Now().Before(until.Add(-time.Millisecond)), "delivered before its delay")
	got.Ack()

	// Unparsable delay metadata is refused before anything is written.
	bad := message.NewMessage("bad", nil)
	bad.Metadata.Set(delay.DelayedForKey, "soon")
	err = pub.Publish("delayed", message.NewMessage("ok", nil), bad)
	var me *pubsub.MessageError
	require.ErrorAs(t, err, &me)
	require.Equal(t, 1, me.Index)
	require.ErrorIs(t, err, pubsub.ErrInvalidMessage)
	require.Equal(t, 0, countJobs(t, pool, schema, "payload->>'uuid' IN ('ok', 'bad')"))
}

// lateRate is how many delayed messages per second fall due in
// BenchmarkDelayedLateness.
const lateRate = 100

// BenchmarkDelayedLateness publishes b.N messages (at least 200) with
// delays spread evenly from 0.5s on, lateRate a second, in one Publish, and reports how late after its delay each is
// received, p50 and p99 (lateness-p50-ms, lateness-p99-ms): one subscriber,
// handlers that ack at once; with the default MaxBatch and with 1.
//
//	go test -run '^$' -bench DelayedLateness -benchtime 300x -count 3 ./events/pubsub/
func BenchmarkDelayedLateness(b *testing.B) {
	for _, c := range []struct {
		name     string
		maxBatch int
	}{{"default", 0}, {"MaxBatch1", 1}} {
		b.Run(c.name, func(b *testing.B) { benchmarkLateness(b, c.maxBatch) })
	}
}

func benchmarkLateness(b *testing.B, maxBatch int) {
	pool, schema := newSchema(b)
	pub, err := pubsub.NewPublisher(pool, pubsub.PublisherConfig{Schema: schema, Logger: watermill.NopLogger{}})
	require.NoError(b, err)
	defer pub.Close()
	sub, err := pubsub.NewSubscriber(pool, pubsub.SubscriberConfig{Schema: schema, MaxBatch: maxBatch, Logger: watermill.NopLogger{}})
	require.NoError(b, err)
	defer sub.Close()
	ch, err := sub.Subscribe(context.Background(), "late")
	require.NoError(b, err)

	n := max(b.N, 200)
	b.ResetTimer()
	dues := make(map[string]time.Time, n)
	msgs := make([]*message.Message, n)
	start := time.Now()
	for i := range msgs {
		m := message.NewMessage(watermill.NewUUID(), nil)
		due := start.Add(500*time.Millisecond + time.Duration(i)*time.Second/lateRate)
		delay.Message(m, delay.Until(due))
		dues[m.UUID] = due
		msgs[i] = m
	}
	require.NoError(b, pub.Publish("late", msgs...))
	late := make([]time.Duration, 0, n)
	for range n {
		select {
		case m := <-ch:
			late = append(late, time.Since(dues[m.UUID]))
			m.Ack()
		case <-time.After(time.Minute):
			b.Fatal("no message within a minute")
		}
	}
	b.StopTimer()
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	b.ReportMetric(float64(late[len(late)/2].Microseconds())/1000, "lateness-p50-ms")
	b.ReportMetric(float64(late[len(late)*99/100].Microseconds())/1000, "lateness-p99-ms")
}
