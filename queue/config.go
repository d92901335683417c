package queue

import (
	"os"

	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/migrations"
	"github.com/pgwake/pgwake/notify"
)

// Handler runs one job. tx is the claim transaction: writes made through it
// commit atomically with the job's completion, or roll back with a failure.
// Returning an error (or panicking) fails the attempt. The handler must not
// Commit or Rollback tx; pgwake does. tx is the handler's until it returns:
// a later use fails with ErrTxAfterHandler. A setting it changes (SET ROLE,
// a timeout) does not reach pgwake's statements, and one that would outlive
// the transaction gets the connection closed (docs/semantics.md).
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, job *Job) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, job *Job) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, job *Job) error { return f(ctx, tx, job) }

// QueueConfig configures the workers of one queue.
type QueueConfig struct {
	// MaxWorkers is how many jobs of this queue run at once in this client.
	// Default 10, in both modes. A leased job's handler holds no pool
	// connection, so a queue of leased kinds can run many more (with
	// AllowSmallPool the pool need not grow with it), and a backlog drains
	// faster with more: each leased claim takes at most the free slots and
	// costs a commit. The default does not grow for leased kinds, because
	// they are also the long and heavy ones (encodes, report builds) that
	// must not start 100 at once unasked; River too asks for the number
	// (its QueueConfig.MaxWorkers has no default). Set it for leased queues.
	MaxWorkers int
}

// Config configures a Client. Every field is optional; a Client with no
// Queues only enqueues.
type Config struct {
	// Schema holds pgwake's tables (see package migrations). Default "pgwake".
	Schema string
	// Queues maps each queue this client works to its settings. Default
	// none. Queues need Handlers: New refuses Queues without them.
	Queues map[string]QueueConfig
	// Handlers maps job kinds to handlers. A claimed job whose kind has no
	// handler fails its attempt with ErrUnknownKind.
	Handlers map[string]Handler
	// JobTimeout bounds one attempt: the handler's context is cancelled after
	// it and the attempt fails. Default 1m; negative means no timeout.
	JobTimeout time.Duration
	// KindTimeouts overrides JobTimeout per kind (negative: no timeout; 0:
	// JobTimeout, as River's Worker.Timeout).
	KindTimeouts map[string]time.Duration
	// PollInterval is the longest a worker sleeps without looking at the
	// database when no notification arrives. Default 2s.
	PollInterval time.Duration
	// ShutdownTimeout is how long Run lets running handlers finish after its
	// context is cancelled before cancelling their contexts. Default 10s.
	ShutdownTimeout time.Duration
	// Backoff returns the delay before retry number attempt (1 after the first
	// failure). Default DefaultBackoff: 30s, 1m, 2m, 4m, ... capped at 24h.
	Backoff func(attempt int) time.Duration
	// RetryPolicies overrides Backoff per kind, with a policy that sees the
	// job and its error (a negative delay fails the job for good). Default
	// none.
	RetryPolicies map[string]RetryPolicy
	// MaxBatch caps how many jobs one claim transaction takes. Under a
	// backlog (the previous claim found work, or every worker slot is busy)
	// and with fast handlers, a claim takes several due jobs and runs them
	// one after another in that transaction, each behind its own savepoint,
	// then commits them together: far fewer commits and round trips per job.
	// The batch is sized so its handlers take about BatchTarget; slow
	// handlers get one job per claim. Default 64, MaxMaxBatch: 64 handlers
	// that all write take 64 savepoints, which PostgreSQL's per-backend
	// subtransaction cache still holds; handlers that also nest savepoints
	// of their own overflow it (other sessions then read pg_subtrans until
	// the batch commits), and MaxBatch 32 keeps that margin. 1 disables.
	MaxBatch int
	// BatchTarget is the handler time a batch aims for. Default 2ms.
	BatchTarget time.Duration
	// MaxAttempts is the default NewJob.MaxAttempts. Default 5; 1 to
	// math.MaxInt32.
	MaxAttempts int
	// MaxPayloadBytes rejects larger payloads at enqueue. Default 1 MiB.
	MaxPayloadBytes int
	// MaxErrorBytes truncates stored error text. Default 4096.
	MaxErrorBytes int
	// Retention is how long Run keeps finished jobs in the jobs table:
	// succeeded and cancelled 24h, failed 7 days by default; negative keeps
	// them for ever. See Retention.
	Retention Retention
	// Listener is a shared LISTEN connection (one per process). When nil, Run
	// starts its own from ListenerConnConfig. A shared Listener is run by its
	// owner, not by the Client.
	Listener *notify.Listener
	// ListenerConnConfig is the connection Run's own Listener uses. Default:
	// the pool's connection config. Behind PgBouncer (transaction pooling)
	// set it to a direct PostgreSQL connection.
	ListenerConnConfig *pgx.ConnConfig
	// Logger gets the client's logs; payloads are never logged. Default
	// DefaultLogger(): warnings and errors to stderr, so that a pool too
	// small or a lost attempt is seen. zap.NewNop() silences it.
	Logger *zap.Logger
	// LeasedKinds run in leased mode: the claim commits at once (state
	// running, attempt counted, a lease of LeaseDuration), the handler runs
	// with no connection and no transaction held (its tx argument begins a
	// transaction on first use, which commits with the job's completion), a
	// heartbeat extends the leases of all of a client's running leased jobs
	// with one statement every LeaseDuration/3, and a lease that expires
	// (the worker died or stalled) is rescued by any running client of the
	// queue and retried with backoff. For long jobs and for many concurrent
	// jobs that wait on something else: they hold no pool connection while
	// they run. Default none: every kind runs in held-transaction mode.
	LeasedKinds []string
	// LeaseDuration is how long a leased job's claim lasts without a
	// heartbeat. Default 30s; at least 100ms.
	LeaseDuration time.Duration
	// AllowSmallPool lets New accept a pool with fewer connections than
	// MinPoolConns: concurrency is then capped by the pool, and handlers that
	// use the pool may wait for connections. Default false: New returns a
	// *PoolTooSmallError.
	AllowSmallPool bool
	// Registerer gets the client's metrics. Default: none registered.
	Registerer prometheus.Registerer
	// Periodic are jobs Run enqueues on a schedule, one job per slot
	// however many clients run the same schedule (see PeriodicJob). A
	// client with Periodic and no Queues runs only the schedules. Default
	// none.
	Periodic []PeriodicJob
	// Hooks are called around enqueues and attempts, for tracing
	// (package otelpgwake) or similar. Default none: no cost.
	Hooks Hooks
}

// Defaults of Config and QueueConfig, filled in by New.
const (
	DefaultMaxWorkers      = 10
	DefaultJobTimeout      = time.Minute
	DefaultPollInterval    = 2 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultMaxAttempts     = 5
	DefaultMaxBatch        = 64
	DefaultBatchTarget     = 2 * time.Millisecond
	DefaultMaxPayloadBytes = 1 << 20
	DefaultMaxErrorBytes   = 4096
	DefaultLeaseDuration   = 30 * time.Second
)

// Limits New enforces (also used by pgwake worker and the Watermill
// subscriber).
const (
	MaxMaxWorkers   = 10000                 // QueueConfig.MaxWorkers at most
	MinPollInterval = 10 * time.Millisecond // Config.PollInterval at least
	// Config.MaxBatch at most: each job of a batch runs behind its own
	// savepoint, and a transaction with more than 64 subtransactions
	// overflows PostgreSQL's per-backend subtransaction cache, which slows
	// every snapshot on the server.
	MaxMaxBatch        = 64
	MinLeaseDuration   = 100 * time.Millisecond
	MinMaxErrorBytes   = 64
	MinMaxPayloadBytes = 2
)

// ErrUnknownKind fails an attempt whose kind has no handler.
var ErrUnknownKind = errors.New("no handler registered for kind")

// ErrInvalidConfig is wrapped by configuration errors from New.
var ErrInvalidConfig = errors.New("invalid queue config")

// ErrInvalidSchema is returned for a schema name that is not a plain identifier.
var ErrInvalidSchema = migrations.ErrInvalidSchema

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.JobTimeout == 0 {
		c.JobTimeout = DefaultJobTimeout
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.BatchTarget == 0 {
		c.BatchTarget = DefaultBatchTarget
	}
	if c.MaxPayloadBytes == 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.MaxErrorBytes == 0 {
		c.MaxErrorBytes = DefaultMaxErrorBytes
	}
	if c.Logger == nil {
		c.Logger = DefaultLogger()
	}
	c.Retention = c.Retention.withDefaults()
	qs := make(map[string]QueueConfig, len(c.Queues))
	for name, qc := range c.Queues {
		if qc.MaxWorkers == 0 {
			qc.MaxWorkers = DefaultMaxWorkers
		}
		qs[name] = qc
	}
	c.Queues = qs
	return c
}

func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	for name, qc := range c.Queues {
		if err := ValidateQueue(name); err != nil {
			return fmt.Errorf("%w: Queues: %w", ErrInvalidConfig, err)
		}
		if qc.MaxWorkers < 1 || qc.MaxWorkers > MaxMaxWorkers {
			return bad("Queues[%q].MaxWorkers %d is outside 1..%d", name, qc.MaxWorkers, MaxMaxWorkers)
		}
	}
	for kind, h := range c.Handlers {
		if err := ValidateKind(kind); err != nil {
			return fmt.Errorf("%w: Handlers: %w", ErrInvalidConfig, err)
		}
		if h == nil {
			return bad("Handlers[%q] is nil", kind)
		}
	}
	if len(c.Queues) > 0 && len(c.Handlers) == 0 {
		// Its workers would claim every job of those queues and fail it
		// (ErrUnknownKind), next to the workers that can run them
		// (TestQueuesWithoutHandlersAreRefused; River refuses it too).
		return bad("Queues without Handlers: the workers would claim and fail every job of their queues")
	}
	for kind := range c.KindTimeouts {
		if _, ok := c.Handlers[kind]; !ok {
			return bad("KindTimeouts[%q] names a kind with no handler", kind)
		}
	}
	for kind, p := range c.RetryPolicies {
		if _, ok := c.Handlers[kind]; !ok || p == nil {
			return bad("RetryPolicies[%q] is nil or names a kind with no handler", kind)
		}
	}
	for _, kind := range c.LeasedKinds {
		if _, ok := c.Handlers[kind]; !ok {
			return bad("LeasedKinds names %q, a kind with no handler", kind)
		}
	}
	if c.LeaseDuration < MinLeaseDuration {
		return bad("LeaseDuration %s is below %s", c.LeaseDuration, MinLeaseDuration)
	}
	if c.PollInterval < MinPollInterval {
		return bad("PollInterval %s is below %s", c.PollInterval, MinPollInterval)
	}
	if c.ShutdownTimeout < 0 {
		return bad("ShutdownTimeout %s is negative", c.ShutdownTimeout)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > math.MaxInt32 { // the column's integer, as NewJob.MaxAttempts (TestMaxAttemptsBeyondInt32)
		return fmt.Errorf("%w: MaxAttempts: %w (got %d)", ErrInvalidConfig, ErrInvalidMaxAttempts, c.MaxAttempts)
	}
	if c.MaxBatch < 1 || c.MaxBatch > MaxMaxBatch {
		return bad("MaxBatch %d is outside 1..%d", c.MaxBatch, MaxMaxBatch)
	}
	if c.BatchTarget < 0 {
		return bad("BatchTarget %s is negative", c.BatchTarget)
	}
	if c.MaxPayloadBytes < MinMaxPayloadBytes {
		return bad("MaxPayloadBytes %d is below %d", c.MaxPayloadBytes, MinMaxPayloadBytes)
	}
	if c.MaxErrorBytes < MinMaxErrorBytes {
		return bad("MaxErrorBytes %d is below %d", c.MaxErrorBytes, MinMaxErrorBytes)
	}
	if err := validatePeriodic(c); err != nil {
		return err
	}
	return c.Retention.validate()
}

// kindTimeout is a kind's job timeout (0: none) and the cause its expiry
// gives the handler's context.
type kindTimeout struct {
	d     time.Duration
	cause error
}

// newKindTimeouts makes the timeout of every registered kind.
func newKindTimeouts(cfg Config) map[string]kindTimeout {
	m := make(map[string]kindTimeout, len(cfg.Handlers))
	for kind := range cfg.Handlers {
		m[kind] = makeKindTimeout(cfg.timeout(kind))
	}
	return m
}

func makeKindTimeout(d time.Duration) kindTimeout {
	if d <= 0 {
		return kindTimeout{}
	}
	return kindTimeout{d: d, cause: fmt.Errorf("%w after %s", ErrJobTimeout, d)}
}

func (c Config) timeout(kind string) time.Duration {
	if d := c.KindTimeouts[kind]; d != 0 {
		return d
	}
	return c.JobTimeout // 0 is the default, as for JobTimeout itself
}

// DefaultLogger is the logger of a Config without one: warnings and errors,
// as JSON lines on stderr.
func DefaultLogger() *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(os.Stderr), zapcore.WarnLevel)).Named("pgwake")
}
