package pubsub

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
	"github.com/pgwake/pgwake/queue"
)

// SubscriberConfig configures a Subscriber. The zero value is usable.
type SubscriberConfig struct {
	// Schema holds pgwake's tables, migrated with migrations.Up (0003 or
	// later; 0016 or later with PoisonTopic). Default "pgwake".
	Schema string
	// ConsumerGroup names the group this subscriber's subscriptions belong
	// to. Every group of a topic gets every message published after the
	// group registered; subscribers of one group compete for them. Default
	// "": the default group.
	ConsumerGroup string
	// NackBackoff is how long a Nacked message waits before it is delivered
	// again (to any subscriber of the group), when RetryPolicy is nil.
	// Default 100ms; a negative value means at once.
	NackBackoff time.Duration
	// RetryPolicy returns how long a Nacked message (or one whose
	// AckTimeout passed) waits before it is delivered again; it sees the job
	// (Attempt is the delivery that was Nacked, MaxAttempts the publisher's)
	// and the error (ErrNacked for a Nack). A negative delay ends the
	// message's deliveries at once, as exhausting MaxAttempts does. It is
	// also asked, with ErrNacked, when a message is handed out, to know
	// whether a Nack would be its last (see PoisonTopic), so it should
	// depend only on its arguments. Default: NackBackoff for every attempt.
	RetryPolicy queue.RetryPolicy
	// PoisonTopic, when set, receives a message whose last delivery is
	// Nacked (its attempts are exhausted, or RetryPolicy gave up): it is
	// published to PoisonTopic in the transaction that completes its job,
	// with the metadata of Watermill's PoisonQueue middleware
	// (ReasonPoisonedKey, PoisonedTopicKey), so
	// that one consumer serves both. What the handler wrote through
	// TxFromContext on that delivery rolls back. Default "": the message's
	// job ends failed, kept for Retention's failed period, and can be put
	// back with queue.Client.Retry.
	PoisonTopic string
	// AckTimeout bounds the time from delivery to Ack or Nack: after it the
	// message's context is cancelled and it counts as Nacked. Default 0: no
	// limit.
	AckTimeout time.Duration
	// CloseTimeout is how long Close (or the Subscribe context's
	// cancellation) waits for the Ack or Nack of a message already handed
	// out, after cancelling its context, before rolling its transaction back
	// (the message is then delivered again). Default 1s.
	CloseTimeout time.Duration
	// MaxBatch is how many messages one claim transaction may take. When
	// handlers are fast and messages are waiting, pgwake claims up to that
	// many (the batch is sized to about 2ms of handler time; slow handlers
	// get one per claim), hands them out one at a time in publish order, and
	// commits them together after the last one is acknowledged: several
	// times the throughput of one message per transaction on a backlog
	// (docs/watermill.md). One subscriber without Nacks still receives a
	// topic's messages in publish order (TestOrderWithDefaultConfig runs
	// Watermill's order tests on the default config). The price: an Ack (and
	// what the handler wrote through TxFromContext) commits only with the
	// rest of its batch, messages claimed behind one that is still out are
	// held (locked) meanwhile, so the members of a group compete batch by
	// batch, and a crash or lost connection redelivers the whole batch.
	// Closing mid-batch counts an attempt for each claimed message not yet
	// handed out. 1 claims one message at a time: its Ack commits at once.
	// Default queue.MaxMaxBatch (64), the most: on a backlog, half the
	// claims and commits of 32 and about a quarter less PostgreSQL CPU per
	// message (docs/watermill.md). A handler's first write through
	// TxFromContext takes a savepoint (a subtransaction), so a batch of 64
	// whose handlers all write uses all of PostgreSQL's 64 cached
	// subtransactions, and one whose handlers also nest savepoints overflows
	// them (other sessions then look in pg_subtrans until it commits); 32
	// keeps that margin. Ignored with Leased.
	MaxBatch int
	// Leased runs the subscriptions' message jobs in the queue's leased mode
	// (queue.Config.LeasedKinds): the claim commits at once (the job is
	// running, its attempt counted, under a lease of LeaseDuration that a
	// heartbeat extends), and while the message is out no connection or
	// transaction is held. For handlers that take long (a held transaction
	// pins the vacuum horizon) or wait on something else. TxFromContext then
	// begins a transaction on first use, which commits with the Ack. A
	// subscriber process that dies leaves the message to be delivered again
	// once its lease expires. MaxBatch does not apply. Default false: the
	// claim transaction stays open until Ack or Nack.
	Leased bool
	// LeaseDuration is the lease of a Leased subscription's message.
	// Default queue.DefaultLeaseDuration (30s); at least
	// queue.MinLeaseDuration.
	LeaseDuration time.Duration
	// PollInterval is the longest a subscription waits without looking at
	// the database when no notification arrives. Default 2s.
	PollInterval time.Duration
	// Listener is a shared LISTEN connection (notify.Listener) run by its
	// owner. Default: the Subscriber runs its own, from ListenerConnConfig,
	// from the first Subscribe until Close.
	Listener *notify.Listener
	// ListenerConnConfig is the connection of the Subscriber's own
	// listener. Default: the pool's connection config.
	ListenerConnConfig *pgx.ConnConfig
	// Retention is how long delivered (acknowledged) and dead-lettered
	// messages stay in the jobs table: each subscription deletes expired
	// ones every minute, as queue workers do. Default queue's: 24h for
	// delivered messages, 7 days for those that exhausted their attempts;
	// negative keeps them for ever.
	Retention queue.Retention
	// Registerer gets the subscriptions' metrics: the queue package's
	// (pgwake_worker_*: deliveries by outcome, succeeded for an Ack and
	// retry for a Nack, handler time, wait, claims by source; queue depth)
	// and the listener's, labelled by queue (wm.<topic>...). Default: none.
	Registerer prometheus.Registerer
	// Logger gets the subscriber's logs (and those of the queue workers and
	// listener under it); payloads are never logged. Use ZapLogger for a
	// *zap.Logger. Default: watermill.NewStdLogger(false, false), info and
	// errors to stderr.
	Logger watermill.LoggerAdapter
}

// Subscriber is a message.Subscriber that delivers the messages of a topic's
// queue for its consumer group. Each Subscribe runs one worker: one message
// is out at a time per returned channel, the next comes after Ack or Nack.
type Subscriber struct {
	pool     *pgxpool.Pool
	cfg      SubscriberConfig
	log      watermill.LoggerAdapter
	zlog     *zap.Logger // log, for the queue and notify packages
	poison   *Publisher  // to PoisonTopic; nil without one
	register string      // SQL

	mu        sync.Mutex
	closed    bool
	subs      map[*subscription]struct{}
	running   sync.WaitGroup // subscriptions
	listener  *notify.Listener
	lcancel   context.CancelFunc
	lrunning  sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ message.Subscriber           = (*Subscriber)(nil)
	_ message.SubscribeInitializer = (*Subscriber)(nil)
)

// NewSubscriber returns a Subscriber on pool. It does not touch the database.
func NewSubscriber(pool *pgxpool.Pool, cfg SubscriberConfig) (*Subscriber, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	if cfg.Schema == "" {
		cfg.Schema = migrations.DefaultSchema
	}
	if cfg.NackBackoff == 0 {
		cfg.NackBackoff = 100 * time.Millisecond
	}
	if cfg.NackBackoff < 0 {
		cfg.NackBackoff = 0
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = time.Second
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 2 * time.Second
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = queue.MaxMaxBatch
	}
	if cfg.Logger == nil {
		cfg.Logger = defaultLogger()
	}
	if err := migrations.ValidateSchema(cfg.Schema); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := ValidateGroup(cfg.ConsumerGroup); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.AckTimeout < 0 {
		return nil, fmt.Errorf("%w: AckTimeout %s is negative", ErrInvalidConfig, cfg.AckTimeout)
	}
	if cfg.CloseTimeout < 0 {
		return nil, fmt.Errorf("%w: CloseTimeout %s is negative", ErrInvalidConfig, cfg.CloseTimeout)
	}
	if cfg.LeaseDuration != 0 && cfg.LeaseDuration < queue.MinLeaseDuration {
		return nil, fmt.Errorf("%w: LeaseDuration %s is below %s", ErrInvalidConfig, cfg.LeaseDuration, queue.MinLeaseDuration)
	}
	if cfg.PoisonTopic != "" {
		if err := ValidateTopic(cfg.PoisonTopic); err != nil {
			return nil, fmt.Errorf("%w: PoisonTopic: %w", ErrInvalidConfig, err)
		}
	}
	if cfg.MaxBatch < 1 || cfg.MaxBatch > queue.MaxMaxBatch {
		return nil, fmt.Errorf("%w: MaxBatch %d is outside 1..%d", ErrInvalidConfig, cfg.MaxBatch, queue.MaxMaxBatch)
	}
	if cfg.PollInterval < queue.MinPollInterval {
		return nil, fmt.Errorf("%w: PollInterval %s is below %s", ErrInvalidConfig, cfg.PollInterval, queue.MinPollInterval)
	}
	var poison *Publisher
	if cfg.PoisonTopic != "" {
		var err error
		if poison, err = NewPublisher(pool, PublisherConfig{Schema: cfg.Schema, Logger: cfg.Logger}); err != nil {
			return nil, err
		}
	}
	if cfg.RetryPolicy == nil {
		backoff := cfg.NackBackoff
		cfg.RetryPolicy = func(*queue.Job, error) time.Duration { return backoff }
	}
	return &Subscriber{
		pool:   pool,
		poison: poison,
		cfg:    cfg,
		log:    cfg.Logger,
		zlog:   zapFor(cfg.Logger),
		register: `INSERT INTO ` + sqlident.Quote(cfg.Schema, "watermill_subscriptions") +
			` (topic, consumer_group, queue) VALUES ($1, $2, $3) ON CONFLICT (topic, consumer_group) DO NOTHING`,
		subs: map[*subscription]struct{}{},
	}, nil
}

// ErrQueueCollision is returned when a (topic, group) pair hashes to the
// queue of another registered pair (a 64-bit hash collision).
var ErrQueueCollision = errors.New("pubsub: queue name collision")

// SubscribeInitialize registers the subscriber's consumer group on topic, so
// that messages published from now on are kept for it even before its first
// Subscribe. Subscribe does this too.
func (s *Subscriber) SubscribeInitialize(topic string) error {
	_, err := s.registerGroup(context.Background(), topic)
	return err
}

func (s *Subscriber) registerGroup(ctx context.Context, topic string) (string, error) {
	q, err := QueueName(topic, s.cfg.ConsumerGroup)
	if err != nil {
		return "", err
	}
	if _, err := s.pool.Exec(ctx, s.register, topic, s.cfg.ConsumerGroup, q); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return "", fmt.Errorf("%w: topic %q group %q maps to queue %s, which another pair holds", ErrQueueCollision, topic, s.cfg.ConsumerGroup, q)
		}
		return "", fmt.Errorf("pubsub: register group %q on topic %q: %w", s.cfg.ConsumerGroup, topic, err)
	}
	return q, nil
}

// RemoveGroup unregisters the subscriber's consumer group from topic and
// cancels the group's pending messages on it: later publishes no longer keep
// messages for the group. Running subscriptions are not stopped.
func (s *Subscriber) RemoveGroup(ctx context.Context, topic string) error {
	q, err := QueueName(topic, s.cfg.ConsumerGroup)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM `+sqlident.Quote(s.cfg.Schema, "watermill_subscriptions")+
			` WHERE topic = $1 AND consumer_group = $2`, topic, s.cfg.ConsumerGroup); err != nil {
			return fmt.Errorf("pubsub: remove group: %w", err)
		}
		jobs := sqlident.Quote(s.cfg.Schema, "jobs")
		events := sqlident.Quote(s.cfg.Schema, "events")
		_, err := tx.Exec(ctx, `
WITH j AS (
	UPDATE `+jobs+` SET state = 'cancelled', finished_at = clock_timestamp()
	WHERE queue = $1 AND state = 'pending'
	RETURNING id, queue, kind, attempts
)
INSERT INTO `+events+` (job_id, type, queue, kind, attempt)
SELECT id, 'cancelled', queue, kind, attempts FROM j`, q)
		if err != nil {
			return fmt.Errorf("pubsub: remove group: cancel pending messages: %w", err)
		}
		return nil
	})
}

// Subscribe registers the consumer group on topic and returns the channel of
// its messages. The channel is closed when ctx is cancelled or Close is
// called, after the message handed out (if any) was acknowledged or its
// CloseTimeout passed. Each message's context carries the values of ctx and
// the claim transaction (TxFromContext); it is cancelled after Ack or Nack.
func (s *Subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if s.isClosed() {
		return nil, ErrClosed
	}
	q, err := s.registerGroup(ctx, topic)
	if err != nil {
		return nil, err
	}
	sub := &subscription{s: s, topic: topic, queue: q, out: make(chan *message.Message)}
	sub.ctx, sub.cancel = context.WithCancel(ctx)
	jobTimeout := s.cfg.AckTimeout
	if jobTimeout == 0 {
		jobTimeout = -1
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		sub.cancel()
		return nil, ErrClosed
	}
	listener, err := s.startListener()
	if err != nil {
		sub.cancel()
		return nil, err
	}
	var leased []string
	if s.cfg.Leased {
		leased = []string{Kind}
	}
	client, err := queue.New(s.pool, queue.Config{
		LeasedKinds:     leased,
		LeaseDuration:   s.cfg.LeaseDuration,
		Schema:          s.cfg.Schema,
		Queues:          map[string]queue.QueueConfig{q: {MaxWorkers: 1}},
		MaxBatch:        s.cfg.MaxBatch,
		Handlers:        map[string]queue.Handler{Kind: queue.HandlerFunc(sub.handle)},
		JobTimeout:      jobTimeout,
		PollInterval:    s.cfg.PollInterval,
		ShutdownTimeout: s.cfg.CloseTimeout + 10*time.Second,
		RetryPolicies:   map[string]queue.RetryPolicy{Kind: s.cfg.RetryPolicy},
		Listener:        listener,
		Retention:       s.cfg.Retention,
		Registerer:      s.cfg.Registerer,
		Logger:          s.zlog,
	})
	if err != nil {
		sub.cancel()
		return nil, fmt.Errorf("pubsub: subscribe to %q: %w", topic, err)
	}
	s.subs[sub] = struct{}{}
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		defer close(sub.out)
		if err := client.Run(sub.ctx); err != nil {
			s.log.Error("pgwake: subscription stopped", err, watermill.LogFields{"topic": topic})
		}
		sub.cancel()
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()
	return sub.out, nil
}

// startListener returns the listener, starting the subscriber's own on first
// use. s.mu is held.
func (s *Subscriber) startListener() (*notify.Listener, error) {
	if s.cfg.Listener != nil {
		return s.cfg.Listener, nil
	}
	if s.listener != nil {
		return s.listener, nil
	}
	cc := s.cfg.ListenerConnConfig
	if cc == nil {
		cc = s.pool.Config().ConnConfig
	}
	l, err := notify.New(notify.Config{ConnConfig: cc, Logger: s.zlog, Registerer: s.cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("pubsub: start listener: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.listener, s.lcancel = l, cancel
	s.lrunning.Go(func() { _ = l.Run(ctx) })
	return l, nil
}

func (s *Subscriber) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close ends every subscription (their channels close), waits for them and
// stops the subscriber's own listener. Messages handed out and not acked
// within CloseTimeout are rolled back and delivered again later. It is safe
// to call more than once.
func (s *Subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for sub := range s.subs {
			sub.cancel()
		}
		s.mu.Unlock()
		s.running.Wait()
		s.mu.Lock()
		if s.lcancel != nil {
			s.lcancel()
		}
		s.mu.Unlock()
		s.lrunning.Wait()
	})
	s.running.Wait()
	s.lrunning.Wait()
	return nil
}

// subscription is one Subscribe call.
type subscription struct {
	s      *Subscriber
	topic  string
	queue  string
	out    chan *message.Message
	ctx    context.Context // cancelled by the Subscribe ctx or Close
	cancel context.CancelFunc
}

// ErrNacked is the error recorded on a job whose message was Nacked.
var ErrNacked = errors.New("message nacked")

// errClosing is the error recorded on a job whose message was handed out (or
// about to be) when its subscription ended.
var errClosing = errors.New("subscription closed before the message was acknowledged")

type txKey struct{}

// TxFromContext returns the claim transaction of the message whose context
// is ctx (msg.Context()). Writes made through it commit atomically with the
// message's Ack and roll back with its Nack. Use it only before Ack or Nack,
// with msg.Context() (or a context derived from it) for every statement; do
// not Commit or Rollback it.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// ErrNotDelivered is returned by NackWith and SetNackOutcome for a message
// that this package did not deliver, or one already acknowledged.
var ErrNotDelivered = errors.New("pubsub: not a message delivered by a pgwake subscriber, or already acked")

type outcomeKey struct{}

// outcomeBox holds what the next Nack of a delivered message means.
type outcomeBox struct {
	mu  sync.Mutex
	err error
}

func (b *outcomeBox) get() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// SetNackOutcome sets what the next Nack of msg (a message delivered by a
// Subscriber, before its Ack or Nack) records, for handlers whose Nack is
// sent by someone else (Watermill's Router Nacks when a handler returns an
// error):
//   - queue.Snooze(d): delivered again after d, the delivery not counted
//     as an attempt (no poison topic);
//   - queue.Cancel(err): not delivered again; the job ends cancelled
//     (no poison topic);
//   - queue.RetryAfter(d, err): delivered again after d instead of the
//     RetryPolicy's delay (on the last attempt, failed or poisoned as any
//     Nack);
//   - any other error: a Nack as usual, with that error in the job's
//     last error.
//
// The error recorded (and seen by RetryPolicy) wraps ErrNacked and the
// outcome. Without an outcome a Nack records ErrNacked. A nil outcome
// clears it.
func SetNackOutcome(msg *message.Message, outcome error) error {
	box, ok := msg.Context().Value(outcomeKey{}).(*outcomeBox)
	if !ok || msg.Context().Err() != nil {
		return ErrNotDelivered
	}
	box.mu.Lock()
	defer box.mu.Unlock()
	box.err = outcome
	return nil
}

// NackWith sets msg's Nack outcome (see SetNackOutcome) and Nacks it.
func NackWith(msg *message.Message, outcome error) error {
	if err := SetNackOutcome(msg, outcome); err != nil {
		return err
	}
	if !msg.Nack() {
		return ErrNotDelivered
	}
	return nil
}

// Metadata keys pgwake sets on every delivered message.
const (
	// AttemptKey is the delivery's attempt number, from 1: 1 on the first
	// delivery, one more after each Nack, ack timeout or lost delivery.
	AttemptKey = "pgwake_attempt"
	// MaxAttemptsKey is how many deliveries the message gets in all
	// (PublisherConfig.MaxAttempts).
	MaxAttemptsKey = "pgwake_max_attempts"
)

// Metadata keys of a message published to SubscriberConfig.PoisonTopic: the
// keys of Watermill's PoisonQueue middleware (middleware.ReasonForPoisonedKey
// and middleware.PoisonedTopicKey), so one consumer reads both.
const (
	ReasonPoisonedKey = "reason_poisoned"
	PoisonedTopicKey  = "topic_poisoned"
)

// handle is the queue handler: it hands the message out and waits for its
// Ack (nil: the job completes) or Nack (an error: the job is retried, or on
// its last attempt fails or goes to the poison topic).
func (sub *subscription) handle(hctx context.Context, tx pgx.Tx, job *queue.Job) error {
	msg, err := decode(job.Payload)
	if err != nil {
		sub.s.log.Error("pgwake: undecodable message job", err, watermill.LogFields{"job_id": job.ID, "queue": job.Queue})
		return err
	}
	msg.Metadata.Set(AttemptKey, strconv.Itoa(job.Attempt))
	msg.Metadata.Set(MaxAttemptsKey, strconv.Itoa(job.MaxAttempts))
	// On a delivery whose Nack would be the last, the handler's writes go
	// behind a savepoint of their own: a Nack rolls them back and the
	// poison message commits with the job.
	htx, last := tx, false
	if sub.s.poison != nil && sub.s.lastAttempt(job) {
		if htx, err = tx.Begin(hctx); err != nil {
			return fmt.Errorf("pubsub: savepoint before the last delivery: %w", err)
		}
		last = true
	}
	box := &outcomeBox{}
	mctx, cancel := context.WithCancel(context.WithValue(context.WithValue(hctx, txKey{}, htx), outcomeKey{}, box))
	defer cancel()
	msg.SetContext(mctx)
	nacked := func() error {
		out := box.get()
		switch {
		case out == nil && !last:
			return ErrNacked
		case out == nil:
			return sub.toPoison(hctx, tx, htx, job, ErrNacked)
		case !last || queue.IsSnooze(out) || queue.IsCancel(out):
			return fmt.Errorf("%w: %w", ErrNacked, out)
		}
		return sub.toPoison(hctx, tx, htx, job, out)
	}

	select {
	case sub.out <- msg:
	case <-sub.ctx.Done():
		return sub.closing(job)
	case <-hctx.Done():
		return sub.timedOut(hctx, job, last)
	}
	select {
	case <-msg.Acked():
		return sub.acked(htx, job)
	case <-msg.Nacked():
		return nacked()
	case <-sub.ctx.Done():
	case <-hctx.Done():
	}
	// Closing or out of time: cancel the message's context and give the
	// handler CloseTimeout to answer.
	cancel()
	t := time.NewTimer(sub.s.cfg.CloseTimeout)
	defer t.Stop()
	select {
	case <-msg.Acked():
		return sub.acked(htx, job)
	case <-msg.Nacked():
		if hctx.Err() != nil {
			return ErrNacked
		}
		return nacked()
	case <-t.C:
	}
	if hctx.Err() != nil {
		return sub.timedOut(hctx, job, last)
	}
	return sub.closing(job)
}

// acked is the outcome of an Ack: nil, the job completes and the
// handler's writes commit with it. After a statement the handler ran in the
// message's transaction failed, its writes are lost: the job is cancelled
// with ErrAckedAfterFailedStatement, not delivered again, as the Ack asks.
// Before, the queue took the Ack for a failed attempt (ErrTxAborted) and
// delivered the message again, and a PoisonQueue middleware, which Acks
// after publishing the poison copy, poisoned it again at every delivery
// (TestAckAfterAFailedStatement).
func (sub *subscription) acked(tx pgx.Tx, job *queue.Job) error {
	if !queue.TxFailed(tx) {
		return nil
	}
	sub.s.log.Info("pgwake: message acked after a statement in its transaction failed; its writes were rolled back and it is not delivered again",
		watermill.LogFields{"job_id": job.ID, "queue": job.Queue})
	return queue.Cancel(ErrAckedAfterFailedStatement)
}

// ErrAckedAfterFailedStatement is the last error of a message's job acked
// after a statement of its handler failed in the message's transaction
// (the job ends cancelled).
var ErrAckedAfterFailedStatement = errors.New("pubsub: the message was acked after a statement in its transaction failed: its writes were rolled back and it is not delivered again")

// closing is the outcome of a delivery that Close cut short. It counts as
// an attempt, except the last one, which would fail the message for good:
// that delivery is given back uncounted (queue.Snooze(0)), so a Close never
// loses a message (TestCloseOnTheLastDeliveryLosesNothing).
func (sub *subscription) closing(job *queue.Job) error {
	if sub.s.lastAttempt(job) {
		return queue.Snooze(0)
	}
	return errClosing
}

// timedOut is the outcome of a delivery whose AckTimeout passed: a Nack.
// On the last delivery with a PoisonTopic (last), the message goes there in a
// transaction of its own (the claim transaction's writes roll back with
// the timed-out attempt) before the job fails
// (TestAckTimeoutOnTheLastDeliveryPoisons).
func (sub *subscription) timedOut(hctx context.Context, job *queue.Job, last bool) error {
	cause := context.Cause(hctx)
	if !last {
		return cause
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(hctx), sub.s.cfg.CloseTimeout+5*time.Second)
	defer cancel()
	err := pgx.BeginFunc(ctx, sub.s.pool, func(tx pgx.Tx) error {
		return sub.publishPoison(ctx, tx, job, fmt.Errorf("%w: %w", ErrNacked, cause))
	})
	if err != nil {
		return fmt.Errorf("%w (and the message could not go to the poison topic: %w)", cause, err)
	}
	return cause
}

// lastAttempt reports whether a Nack of this delivery of job ends its
// deliveries.
func (s *Subscriber) lastAttempt(job *queue.Job) bool {
	return job.Attempt >= job.MaxAttempts || s.cfg.RetryPolicy(job, ErrNacked) < 0
}

// toPoison rolls back the handler's writes (htx, a savepoint in tx) and
// publishes the job's message, as published, to the poison topic in tx,
// which commits with the job's completion.
func (sub *subscription) toPoison(ctx context.Context, tx, htx pgx.Tx, job *queue.Job, reason error) error {
	if err := htx.Rollback(ctx); err != nil {
		return fmt.Errorf("pubsub: roll back the handler's writes before poisoning: %w", err)
	}
	return sub.publishPoison(ctx, tx, job, reason)
}

// publishPoison publishes job's message, as published, to the poison topic
// in tx.
func (sub *subscription) publishPoison(ctx context.Context, tx pgx.Tx, job *queue.Job, reason error) error {
	msg, err := decode(job.Payload)
	if err != nil {
		return err
	}
	// The delay is the original's, long past.
	delete(msg.Metadata, delay.DelayedUntilKey)
	delete(msg.Metadata, delay.DelayedForKey)
	msg.Metadata.Set(ReasonPoisonedKey, fmt.Sprintf("%v on attempt %d of %d", reason, job.Attempt, job.MaxAttempts))
	msg.Metadata.Set(PoisonedTopicKey, sub.topic)
	msg.Metadata.Set(AttemptKey, strconv.Itoa(job.Attempt))
	if err := sub.s.poison.PublishTx(ctx, tx, sub.s.cfg.PoisonTopic, msg); err != nil {
		return fmt.Errorf("pubsub: publish to poison topic %q: %w", sub.s.cfg.PoisonTopic, err)
	}
	sub.s.log.Info("pgwake: message poisoned", watermill.LogFields{"job_id": job.ID, "topic": sub.topic, "poison_topic": sub.s.cfg.PoisonTopic, "attempt": job.Attempt})
	return nil
}
