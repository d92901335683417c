package events_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// flakyPublisher fails while down is set, then passes messages on.
type flakyPublisher struct {
	down atomic.Bool
	next message.Publisher
}

func (f *flakyPublisher) Publish(topic string, msgs ...*message.Message) error {
	if f.down.Load() {
		return errors.New("broker down")
	}
	return f.next.Publish(topic, msgs...)
}

func (f *flakyPublisher) Close() error { return nil }

// While the broker is down nothing is acknowledged (nor dead-lettered), the
// lag shows in the metrics and the logs; when it is back every event is
// delivered.
func TestBrokerOutageHoldsTheSlotAndRecovers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ps, col := channelSink(t)
	flaky := &flakyPublisher{next: ps}
	flaky.down.Store(true)
	core, logs := observer.New(zap.WarnLevel)
	reg := prometheus.NewRegistry()
	cfg := e.Config(flaky)
	cfg.Logger, cfg.Registerer = zap.New(core), reg
	cfg.LagWarnBytes, cfg.LagWarnAge = 1, time.Millisecond
	cfg.MaxBackoff = 200 * time.Millisecond
	// An outage refuses the dead-letter topic too: nothing is dead-lettered.
	cfg.DeadLetterTopic, cfg.PublishAttempts = "pgwake.events.dead", 1
	s, stopStream := e.RunStream(cfg)

	c := e.QueueClient(2)
	_, err := c.EnqueueMany(ctx, make100("ok"))
	require.NoError(t, err)
	waitFor(t, 60*time.Second, "publish errors", func() bool { return metricSum(t, reg, "pgwake_events_publish_errors_total") >= 3 })
	waitFor(t, 60*time.Second, "lag gauges", func() bool {
		return metricSum(t, reg, "pgwake_events_slot_lag_bytes") > 0 && metricSum(t, reg, "pgwake_events_slot_lag_seconds") > 0
	})
	waitFor(t, 60*time.Second, "lag warnings", func() bool {
		return logs.FilterMessage("replication slot retains much WAL").Len() > 0 && logs.FilterMessage("event stream is behind").Len() > 0
	})
	require.Empty(t, col.Snapshot())
	ackedDuringOutage := s.Acked()

	flaky.down.Store(false)
	table := e.WaitDelivered(col, 60*time.Second)
	require.Len(t, table, 100)
	got := col.Snapshot()
	checkDelivery(t, got, table)
	// Nothing at or past the failing transaction's commit was acknowledged.
	require.Less(t, uint64(ackedDuringOutage), got[0].LSN)
	require.Zero(t, metricSum(t, reg, "pgwake_events_dead_lettered_total"))
	waitFor(t, 60*time.Second, "lag seconds back to 0", func() bool { return metricSum(t, reg, "pgwake_events_slot_lag_seconds") == 0 })
	stopStream()
	require.NoError(t, ps.Close())
	<-col.Done
}
