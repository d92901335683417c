package pubsub

import (
	"context"
	"encoding/json"
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
	// Schema holds pgwake's tables, migrated with migrations.Up (0003 or
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
	pool   *pgxpool.Pool
	cfg    PublisherConfig
	client *queue.Client
	groups string // SQL: the registered groups of a topic

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
		pool:   pool,
		cfg:    cfg,
		client: client,
		groups: `SELECT consumer_group, queue FROM ` + sqlident.Quote(cfg.Schema, "watermill_subscriptions") +
			` WHERE topic = $1 ORDER BY consumer_group`,
	}, nil
}

// Publish enqueues msgs on topic in one statement (its own transaction): for
// every consumer group registered on topic, one job per message, in the
// order of msgs. With no group registered yet the messages go to the default
// group's queue, so nothing published is dropped. Every message is checked
// before anything is written; on error nothing is written.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if !p.enter() {
		return ErrClosed
	}
	defer p.inFlight.Done()
	ctx := context.Background()
	jobs, err := p.prepare(topic, msgs)
	if err != nil || len(jobs) == 0 {
		return err
	}
	groups, err := p.topicQueues(ctx, p.pool, topic)
	if err != nil {
		return err
	}
	if _, err := p.client.EnqueueMany(ctx, fanOut(jobs, groups)); err != nil {
		return fmt.Errorf("pubsub: publish to %q: %w", topic, err)
	}
	return nil
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
	jobs, err := p.prepare(topic, msgs)
	if err != nil || len(jobs) == 0 {
		return err
	}
	groups, err := p.topicQueues(ctx, tx, topic)
	if err != nil {
		return err
	}
	if _, err := p.client.EnqueueManyTx(ctx, tx, fanOut(jobs, groups)); err != nil {
		return fmt.Errorf("pubsub: publish to %q: %w", topic, err)
	}
	return nil
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

// prepare validates topic and encodes msgs; the jobs lack their queue.
func (p *Publisher) prepare(topic string, msgs []*message.Message) ([]queue.NewJob, error) {
	if err := ValidateTopic(topic); err != nil {
		return nil, err
	}
	jobs := make([]queue.NewJob, len(msgs))
	now := time.Now()
	for i, m := range msgs {
		b, err := encode(i, topic, m)
		if err != nil {
			return nil, err
		}
		due, err := runAfter(m, now)
		if err != nil {
			return nil, &MessageError{Index: i, UUID: m.UUID, Err: err}
		}
		if len(b) > p.cfg.MaxJobBytes {
			return nil, &MessageError{Index: i, UUID: m.UUID, Err: fmt.Errorf("%w: %d bytes stored, the limit is %d (PublisherConfig.MaxJobBytes)", queue.ErrPayloadTooLarge, len(b), p.cfg.MaxJobBytes)}
		}
		jobs[i] = queue.NewJob{Kind: Kind, Payload: json.RawMessage(b), RunAfter: due}
	}
	return jobs, nil
}

// topicQueues returns the queues of topic's registered groups, or the default
// group's queue when none is registered.
func (p *Publisher) topicQueues(ctx context.Context, q querier, topic string) ([]string, error) {
	rows, err := q.Query(ctx, p.groups, topic)
	if err != nil {
		return nil, fmt.Errorf("pubsub: publish to %q: read consumer groups: %w", topic, err)
	}
	queues, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var group, q string
		err := r.Scan(&group, &q)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("pubsub: publish to %q: read consumer groups: %w", topic, err)
	}
	if len(queues) == 0 {
		q, err := QueueName(topic, "")
		if err != nil {
			return nil, err
		}
		queues = []string{q}
	}
	return queues, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// fanOut copies jobs once per queue, group by group, keeping message order.
func fanOut(jobs []queue.NewJob, queues []string) []queue.NewJob {
	out := make([]queue.NewJob, 0, len(jobs)*len(queues))
	for _, q := range queues {
		for _, j := range jobs {
			j.Queue = q
			out = append(out, j)
		}
	}
	return out
}
