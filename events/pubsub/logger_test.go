package pubsub_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgwake/pgwake/events/pubsub"
	"github.com/pgwake/pgwake/queue"
)

// enqueueBadMessage puts a job of the message kind with a payload that is
// not a message on topic's default-group queue: the subscriber logs an error.
func enqueueBadMessage(t *testing.T, c *queue.Client, topic string) {
	t.Helper()
	q, err := pubsub.QueueName(topic, "")
	require.NoError(t, err)
	_, err = c.Enqueue(context.Background(), queue.NewJob{Queue: q, Kind: pubsub.Kind, Payload: map[string]int{"v": 99}, MaxAttempts: 1})
	require.NoError(t, err)
}

// A watermill.LoggerAdapter in SubscriberConfig gets the subscriber's logs.
func TestLoggerAdapterReceivesLogs(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(t, err)
	rec := &recorder{}
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, Logger: rec})
	_, err = sub.Subscribe(context.Background(), "bad")
	require.NoError(t, err)
	enqueueBadMessage(t, c, "bad")
	waitFor(t, wait, "error logged to the adapter", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		for _, e := range rec.errs {
			if e.msg == "pgwake: undecodable message job" && errors.Is(e.err, pubsub.ErrBadEnvelope) && e.fields["job_id"] != nil {
				return true
			}
		}
		return false
	})
}

// ZapLogger keeps a *zap.Logger working: the subscriber's logs, and those of
// the queue underneath, reach it with their fields.
func TestZapLoggerAdapter(t *testing.T) {
	t.Parallel()
	pool, schema := newSchema(t)
	c, err := queue.New(pool, queue.Config{Schema: schema})
	require.NoError(t, err)
	core, logs := observer.New(zapcore.DebugLevel)
	sub := newSubscriber(t, pool, pubsub.SubscriberConfig{Schema: schema, Logger: pubsub.ZapLogger(zap.New(core))})
	_, err = sub.Subscribe(context.Background(), "bad")
	require.NoError(t, err)
	enqueueBadMessage(t, c, "bad")
	waitFor(t, wait, "error logged to zap", func() bool {
		return logs.FilterMessage("pgwake: undecodable message job").FilterFieldKey("job_id").Len() > 0
	})

	a := pubsub.ZapLogger(zap.New(core)).With(watermill.LogFields{"topic": "x"})
	a.Info("hello", watermill.LogFields{"n": 1})
	e := logs.FilterMessage("hello").All()
	require.Len(t, e, 1)
	require.Equal(t, "x", e[0].ContextMap()["topic"])
	require.EqualValues(t, 1, e[0].ContextMap()["n"])
}

// recorder is a watermill.LoggerAdapter that keeps its Error calls
// (watermill.CaptureLoggerAdapter's Captured hands out its map unlocked).
type recorder struct {
	watermill.NopLogger
	mu   sync.Mutex
	errs []recorded
}

type recorded struct {
	msg    string
	err    error
	fields watermill.LogFields
}

func (r *recorder) Error(msg string, err error, fields watermill.LogFields) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, recorded{msg, err, fields})
}

func (r *recorder) With(watermill.LogFields) watermill.LoggerAdapter { return r }
