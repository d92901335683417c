package events

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/pgwake/pgwake/internal/floor"
	"github.com/pgwake/pgwake/internal/sqlident"
	"github.com/pgwake/pgwake/migrations"
)

// Config configures a Stream. Publisher is required; every other field has a
// default.
type Config struct {
	// Schema holds pgwake's tables. Default "pgwake".
	Schema string
	// Slot is the logical replication slot's name ([a-z0-9_], at most 63
	// bytes). The slot is created (pgoutput) if it does not exist and
	// persists across restarts: it is where the stream resumes. Default
	// "<schema>_events". A slot whose consumer is gone retains WAL without
	// bound: drop it with DropSlot when it is no longer used.
	Slot string
	// TemporarySlot makes the slot temporary: dropped by the server when the
	// connection ends. After a reconnect a new slot starts at the current
	// WAL position, so events committed meanwhile are not streamed (pgwake
	// events tail uses a persistent slot it drops on exit instead). Default
	// false.
	TemporarySlot bool
	// Publication is the publication on <schema>.events (inserts only). It is
	// created if it does not exist, which needs ownership of the table.
	// Default "<schema>_events".
	Publication string
	// Publisher receives every event as a Watermill message. Required.
	Publisher message.Publisher
	// Topic names the topic of an event. Default SingleTopic("pgwake.events").
	Topic TopicFunc
	// DeadLetterTopic, when set, receives an event its own topic refused
	// PublishAttempts times in a row while the dead-letter topic accepts
	// it (logged with its id, counted in pgwake_events_dead_lettered_total),
	// so one event cannot hold the stream for ever. When the dead-letter
	// topic refuses too (the broker is down), publishing is retried as
	// without one. Default "": every publish is retried until it succeeds.
	DeadLetterTopic string
	// PublishAttempts is how many failed attempts of a publish precede the
	// dead-letter topic. Default 5.
	PublishAttempts int
	// ReplConnConfig is the replication connection's config. Default: the
	// pool's connection config with replication=database. Its user needs
	// the REPLICATION attribute (or superuser).
	ReplConnConfig *pgconn.Config
	// StatusInterval is the longest time between two standby status updates
	// (acknowledgements) to the server; it must be well under the server's
	// wal_sender_timeout (default 60s). Default 10s; at least
	// MinStatusInterval.
	StatusInterval time.Duration
	// MaxBatch bounds the events published per acknowledgement round, and
	// the events of one transaction held in memory: a larger transaction is
	// published in parts of MaxBatch (its position is acknowledged after the
	// last). Default 1000.
	MaxBatch int
	// MinBackoff and MaxBackoff bound the exponential backoff (with jitter)
	// between reconnects and between publish retries. A session that
	// streamed for MaxBackoff (at least 1s) starts the reconnect backoff
	// over; one that fails sooner keeps doubling it. Defaults 100ms, 10s;
	// each at least MinMinBackoff.
	MinBackoff, MaxBackoff time.Duration
	// LagInterval is how often the slot's lag is checked against
	// LagWarnBytes and LagWarnAge; the lag gauges are measured when
	// scraped. Default 10s; at least MinLagInterval.
	LagInterval time.Duration
	// LagWarnBytes logs a warning when the slot retains more WAL than this.
	// Default 1 GiB; negative disables.
	LagWarnBytes int64
	// LagWarnAge logs a warning when the transaction being published
	// committed longer ago than this. Default 5m; negative disables.
	LagWarnAge time.Duration
	// Logger gets the stream's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer gets the stream's metrics (docs/events.md). Default: none.
	Registerer prometheus.Registerer
}

// ErrInvalidConfig is wrapped by configuration errors from New.
var ErrInvalidConfig = errors.New("invalid events config")

// Defaults of Config's fields, applied where a field is zero.
const (
	DefaultStatusInterval  = 10 * time.Second
	DefaultMaxBatch        = 1000
	DefaultPublishAttempts = 5
	DefaultMinBackoff      = 100 * time.Millisecond
	DefaultMaxBackoff      = 10 * time.Second
	DefaultLagInterval     = 10 * time.Second
	DefaultLagWarnBytes    = 1 << 30
	DefaultLagWarnAge      = 5 * time.Minute
)

func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = migrations.DefaultSchema
	}
	if c.Slot == "" {
		c.Slot = c.Schema + "_events"
	}
	if c.Publication == "" {
		c.Publication = c.Schema + "_events"
	}
	if c.Topic == nil {
		c.Topic = SingleTopic("pgwake.events")
	}
	if c.StatusInterval == 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.PublishAttempts == 0 {
		c.PublishAttempts = DefaultPublishAttempts
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.LagInterval == 0 {
		c.LagInterval = DefaultLagInterval
	}
	if c.LagWarnBytes == 0 {
		c.LagWarnBytes = DefaultLagWarnBytes
	}
	if c.LagWarnAge == 0 {
		c.LagWarnAge = DefaultLagWarnAge
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return c
}

func (c Config) validate() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return err
	}
	if err := ValidateSlotName(c.Slot); err != nil {
		return err
	}
	if err := sqlident.Validate("publication name", c.Publication, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.Publisher == nil {
		return fmt.Errorf("%w: Publisher is nil", ErrInvalidConfig)
	}
	if c.StatusInterval < 0 || c.MaxBatch < 0 || c.PublishAttempts < 0 || c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff || c.LagInterval < 0 {
		return fmt.Errorf("%w: negative interval, batch or backoff (or MaxBackoff < MinBackoff)", ErrInvalidConfig)
	}
	// A nanosecond LagInterval ran the lag query without pause (~160 a
	// second on an idle stream: TestTinyStreamIntervalsAreRefused).
	if err := floor.Check(floor.D{Name: "StatusInterval", Value: c.StatusInterval, Min: MinStatusInterval},
		floor.D{Name: "LagInterval", Value: c.LagInterval, Min: MinLagInterval},
		floor.D{Name: "MinBackoff", Value: c.MinBackoff, Min: MinMinBackoff},
		floor.D{Name: "MaxBackoff", Value: c.MaxBackoff, Min: MinMinBackoff}); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Floors of Config's durations, which New enforces.
const (
	MinStatusInterval = 100 * time.Millisecond
	MinLagInterval    = 100 * time.Millisecond
	MinMinBackoff     = time.Millisecond // MinBackoff and MaxBackoff at least
)

// ErrInvalidSlotName is wrapped by the error for a slot name that is not a
// plain identifier.
var ErrInvalidSlotName = errors.New("invalid replication slot name")

// ValidateSlotName checks a replication slot name: 1 to 63 bytes of
// [a-z0-9_], not starting with a digit (PostgreSQL allows the digit; we
// use the same rule as for every identifier).
func ValidateSlotName(name string) error {
	if err := sqlident.Validate("replication slot name", name, 0); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidSlotName, err)
	}
	return nil
}

// TopicFunc names the topic an event is published to.
type TopicFunc func(Event) string

// SingleTopic publishes every event to one topic.
func SingleTopic(topic string) TopicFunc { return func(Event) string { return topic } }

// TopicPerType publishes to prefix + "." + SubjectSafe(event type), e.g.
// "pgwake.events.succeeded".
func TopicPerType(prefix string) TopicFunc {
	return func(e Event) string { return prefix + "." + SubjectSafe(string(e.Type)) }
}

// TopicPerQueue publishes to prefix + "." + SubjectSafe(queue), e.g.
// "pgwake.events.emails"; the queue "a..b" goes to "pgwake.events.a%2E%2Eb".
func TopicPerQueue(prefix string) TopicFunc {
	return func(e Event) string { return prefix + "." + SubjectSafe(e.Queue) }
}

// SubjectSafe maps a name to a valid NATS subject tail (and a plain
// RabbitMQ exchange name part). A name of ASCII letters, digits, '_' and
// '-' in non-empty dot-separated tokens is returned as it is ("emails",
// "billing.eu"); any other name becomes one token with every other byte,
// dots included, written as %XX ("a..b" -> "a%2E%2Eb", "" -> "%00"). Two
// different names never map to the same string.
func SubjectSafe(name string) string {
	if subjectClean(name) {
		return name
	}
	if name == "" {
		return "%00"
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(name)+8)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if subjectByte(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', hex[c>>4], hex[c&15])
		}
	}
	return string(b)
}

func subjectByte(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'
}

// subjectClean reports whether name is non-empty dot-separated tokens of
// subjectByte bytes.
func subjectClean(name string) bool {
	token := 0
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case c == '.':
			if token == 0 {
				return false
			}
			token = 0
		case subjectByte(c):
			token++
		default:
			return false
		}
	}
	return token > 0
}
