package pubsub

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/queue"
)

// ErrClosed is returned by Publish and Subscribe after Close.
var ErrClosed = errors.New("pubsub: closed")

// ErrInvalidConfig is wrapped by configuration errors from NewPublisher and
// NewSubscriber.
var ErrInvalidConfig = errors.New("pubsub: invalid config")

// Unlimited is the MaxAttempts of a message job when PublisherConfig.MaxAttempts
// is 0: in practice, a message is redelivered after every Nack for ever.
const Unlimited = math.MaxInt32

// PublisherConfig configures a Publisher. The zero value is usable.
type PublisherConfig struct {
	// Schema holds pgwake's tables, migrated with migrations.Up (0016 or
	// later). Default "pgwake".
	Schema string
	// MaxAttempts is how many deliveries a message gets (a Nack, an ack
	// timeout or a subscriber closing before Ack each use one) before its
	// job is marked failed and it is no longer delivered. Default 0:
	// Unlimited. A failed message can be put back with queue.Client.Retry.
	MaxAttempts int
	// MaxJobBytes bounds the stored JSON of one message (its payload grows by
	// a third in base64, plus UUID and metadata). Default 1 MiB.
	MaxJobBytes int
	// Registerer gets pgwake_queue_enqueued_total (one per message and
	// consumer group, by queue). Default: none.
	Registerer prometheus.Registerer
	// Logger gets the publisher's logs (and those of the queue client it
	// enqueues with); payloads are never logged. Use ZapLogger for a
	// *zap.Logger. Default: watermill.NewStdLogger(false, false), info and
	// errors to stderr.
	Logger watermill.LoggerAdapter
}

// Publisher is a message.Publisher that enqueues one pgwake job per message
// and consumer group. It is safe for concurrent use.
type Publisher struct {
	pool       *pgxpool.Pool
	cfg        PublisherConfig
	client     *queue.Client
	publishSQL string // watermill_publish

	mu       sync.RWMutex
	closed   bool
	inFlight sync.WaitGroup
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on pool. It does not touch the database.
func NewPublisher(pool *pgxpool.Pool, cfg PublisherConfig) (*Publisher, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	if cfg.Schema == "" {
		cfg.Schema = migrations.DefaultSchema
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = Unlimited
	}
	if cfg.MaxJobBytes == 0 {
		cfg.MaxJobBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = defaultLogger()
	}
	if cfg.MaxAttempts < 1 {
		return nil, fmt.Errorf("%w: MaxAttempts %d is below 1", ErrInvalidConfig, cfg.MaxAttempts)
	}
	client, err := queue.New(pool, queue.Config{
		Schema:          cfg.Schema,
		MaxAttempts:     cfg.MaxAttempts,
		MaxPayloadBytes: cfg.MaxJobBytes,
		Registerer:      cfg.Registerer,
		Logger:          zapFor(cfg.Logger),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Publisher{
		pool:       pool,
		cfg:        cfg,
		client:     client,
		publishSQL: `SELECT ids, queues FROM ` + sqlident.Quote(cfg.Schema, "watermill_publish") + `($1, $2, $3, $4, $5, $6, $7)`,
	}, nil
}

// Publish enqueues msgs on topic in one statement and one round trip (its
// own transaction; the function watermill_publish of migration 0016 reads
// the topic's groups and enqueues): for every consumer group registered on
// topic, one job per message, in the order of msgs. A message with
// Watermill's delay metadata (package components/delay) is delivered when
// its delay is due. With no group registered yet the messages go to the default
// group's queue, so nothing published is dropped. Every message is checked
// before anything is written; on error nothing is written.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if !p.enter() {
		return ErrClosed
	}
	defer p.inFlight.Done()
	return p.publish(context.Background(), p.pool, topic, msgs)
}

// PublishTx is Publish in the caller's transaction: the messages exist, and
// subscribers are woken, only if tx commits.
func (p *Publisher) PublishTx(ctx context.Context, tx pgx.Tx, topic string, msgs ...*message.Message) error {
	if tx == nil {
		return fmt.Errorf("%w: nil transaction", ErrInvalidConfig)
	}
	if !p.enter() {
		return ErrClosed
	}
	defer p.inFlight.Done()
	return p.publish(ctx, tx, topic, msgs)
}

// WithTx returns a message.Publisher that publishes with PublishTx in tx,
// for code that takes a message.Publisher (a Watermill router's handler, for
// instance). Its Close does nothing; tx stays the caller's to commit.
func (p *Publisher) WithTx(ctx context.Context, tx pgx.Tx) message.Publisher {
	return txPublisher{p: p, ctx: ctx, tx: tx}
}

type txPublisher struct {
	p   *Publisher
	ctx context.Context
	tx  pgx.Tx
}

func (t txPublisher) Publish(topic string, msgs ...*message.Message) error {
	return t.p.PublishTx(t.ctx, t.tx, topic, msgs...)
}

func (t txPublisher) Close() error { return nil }

// Close waits for running Publish calls and makes later ones return
// ErrClosed. It is safe to call more than once.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.inFlight.Wait()
	return nil
}

func (p *Publisher) enter() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return false
	}
	p.inFlight.Add(1)
	return true
}

// publish enqueues msgs on topic for each of its groups with one statement
// (watermill_publish, migration 0016) on q.
func (p *Publisher) publish(ctx context.Context, q querier, topic string, msgs []*message.Message) error {
	payloads, runAfters, err := p.prepare(topic, msgs)
	if err != nil || len(payloads) == 0 {
		return err
	}
	defaultQueue, err := QueueName(topic, "")
	if err != nil {
		return err
	}
	var ids []int64
	var queues []string
	rows, err := q.Query(ctx, p.publishSQL, topic, Kind, defaultQueue, payloads, runAfters, int32(p.cfg.MaxAttempts), int32(p.cfg.MaxJobBytes))
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&ids, &queues}, func() error { return nil })
	}
	if err != nil {
		return fmt.Errorf("pubsub: publish to %q: %w", topic, err)
	}
	if len(ids) != len(payloads)*len(queues) {
		return fmt.Errorf("pubsub: publish to %q: internal error: %d ids for %d messages and %d groups", topic, len(ids), len(payloads), len(queues))
	}
	for _, q := range queues {
		p.client.CountEnqueued(q, Kind, len(payloads))
	}
	return nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// prepare validates topic and msgs and returns each message's job payload
// and due time (nil: now).
func (p *Publisher) prepare(topic string, msgs []*message.Message) ([]string, []*time.Time, error) {
	if err := ValidateTopic(topic); err != nil {
		return nil, nil, err
	}
	payloads := make([]string, len(msgs))
	runAfters := make([]*time.Time, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		b, err := encode(i, topic, m)
		if err != nil {
			return nil, nil, err
		}
		due, err := runAfter(m, now)
		if err != nil {
			return nil, nil, &MessageError{Index: i, UUID: m.UUID, Err: err}
		}
		if len(b) > p.cfg.MaxJobBytes {
			return nil, nil, &MessageError{Index: i, UUID: m.UUID, Err: fmt.Errorf("%w: %d bytes stored, the limit is %d (PublisherConfig.MaxJobBytes)", queue.ErrPayloadTooLarge, len(b), p.cfg.MaxJobBytes)}
		}
		payloads[i] = string(b)
		if !due.IsZero() {
			runAfters[i] = &due
		}
	}
	return payloads, runAfters, nil
}
