package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/pgwake/pgwake/bench/harness"
)

// watermillSystem is watermill-sql (PostgreSQL schema and offsets adapters
// on pgx) as a harness.System: a publisher, and one subscriber whose
// handler acks every message after reporting it. Default config, or, when
// tuned, PollInterval 10ms. It is a log with consumer offsets, not a job
// queue: no per-message completion state, no delays, so it runs drain,
// latency and idle only.
type watermillSystem struct {
	tuned bool

	env   *harness.Env
	topic string
	pub   *wsql.Publisher
	n     int
}

func (w *watermillSystem) Name() string {
	if w.tuned {
		return "watermill-tuned"
	}
	return "watermill-default"
}

func (w *watermillSystem) Config() string {
	s := "watermill-sql " + watermillSQLVersion + " pgx, DefaultPostgreSQLSchema + offsets adapter; one subscriber"
	if w.tuned {
		return s + "; PollInterval 10ms"
	}
	return s + "; defaults (PollInterval 1s, batch 100)"
}

func (w *watermillSystem) Supports(m harness.Mode) bool {
	return m == harness.ModeDrain || m == harness.ModeLatency || m == harness.ModeIdle
}

func (w *watermillSystem) Setup(ctx context.Context, env *harness.Env) error {
	w.env = env
	w.n++
	w.topic = fmt.Sprintf("bench_%d_%d", time.Now().UnixNano()%1e9, w.n)
	// Create the tables now, not in the first timed publish.
	sub, err := w.subscriber()
	if err != nil {
		return err
	}
	if err := sub.SubscribeInitialize(w.topic); err != nil {
		_ = sub.Close()
		return err
	}
	if err := sub.Close(); err != nil {
		return err
	}
	w.pub, err = wsql.NewPublisher(wsql.BeginnerFromPgx(env.Pool), wsql.PublisherConfig{
		SchemaAdapter: wsql.DefaultPostgreSQLSchema{},
	}, watermill.NopLogger{})
	return err
}

func (w *watermillSystem) subscriber() (*wsql.Subscriber, error) {
	cfg := wsql.SubscriberConfig{
		SchemaAdapter:    wsql.DefaultPostgreSQLSchema{},
		OffsetsAdapter:   wsql.DefaultPostgreSQLOffsetsAdapter{},
		InitializeSchema: true,
	}
	if w.tuned {
		cfg.PollInterval = 10 * time.Millisecond
	}
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(w.env.Pool), cfg, watermill.NopLogger{})
}

func (w *watermillSystem) messages(jobs []harness.Job) []*message.Message {
	msgs := make([]*message.Message, len(jobs))
	for i, j := range jobs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), harness.EncodePayload(j))
	}
	return msgs
}

// InsertMany publishes the jobs in one call (one INSERT).
func (w *watermillSystem) InsertMany(ctx context.Context, jobs []harness.Job) error {
	return w.pub.Publish(w.topic, w.messages(jobs)...)
}

// Enqueue publishes one message (one INSERT, its own transaction).
func (w *watermillSystem) Enqueue(ctx context.Context, j harness.Job) error {
	return w.pub.Publish(w.topic, w.messages([]harness.Job{j})...)
}

func (w *watermillSystem) Start(ctx context.Context, handle harness.HandleFunc) (func() error, error) {
	sub, err := w.subscriber()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	msgs, err := sub.Subscribe(ctx, w.topic)
	if err != nil {
		cancel()
		_ = sub.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	var herr error
	wg.Go(func() {
		for m := range msgs {
			seq, err := harness.DecodePayload(m.Payload)
			if err != nil {
				herr = err
				m.Nack()
				continue
			}
			handle(seq)
			m.Ack()
		}
	})
	var once sync.Once
	var result error
	return func() error {
		once.Do(func() {
			cancel()
			result = sub.Close()
			wg.Wait()
			result = errors.Join(result, herr)
		})
		return result
	}, nil
}

func (w *watermillSystem) Teardown(ctx context.Context) error {
	if w.topic == "" {
		return nil
	}
	if w.pub != nil {
		_ = w.pub.Close()
	}
	_, err := w.env.Pool.Exec(ctx, `DROP TABLE IF EXISTS `+pgx.Identifier{"watermill_" + w.topic}.Sanitize()+`, `+
		pgx.Identifier{"watermill_offsets_" + w.topic}.Sanitize())
	w.topic, w.pub = "", nil
	return err
}
